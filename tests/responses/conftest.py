"""Servers with their own data folder (the store of responses and conversations), on the real
model (rserver, rclient) or on the scripted host (srserver, srclient)."""

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


@pytest.fixture(scope="session")
def scripted_data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("scripted-responses-data")


@pytest.fixture(scope="session")
def scripted_rserver(scripted_host, make_server, scripted_data_dir):
    return make_server(scripted_host, data_dir=str(scripted_data_dir))


@pytest.fixture
def srserver(scripted_rserver, script):
    """The server on the scripted host with a store, its script reset for this test."""
    return scripted_rserver


@pytest.fixture(scope="session")
def scripted_rclient(scripted_rserver):
    """One client for the session (a client costs tens of milliseconds to make)."""
    return openai_client(scripted_rserver)


@pytest.fixture
def srclient(srserver, scripted_rclient):
    return scripted_rclient
