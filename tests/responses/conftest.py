"""A server on the real model with its own data folder (the store of responses and conversations)."""

from __future__ import annotations

import pytest
from support.servers import openai_client


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("responses-data")


@pytest.fixture(scope="session")
def rserver(llama_host, make_server, data_dir):
    return make_server(llama_host, data_dir=str(data_dir))


@pytest.fixture
def rclient(rserver):
    return openai_client(rserver)

