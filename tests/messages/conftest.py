"""The Anthropic SDK's client of the standalone API, on the real model or on the scripted host."""

from __future__ import annotations

import pytest
from support.anthropic_types import anthropic_client


@pytest.fixture
def claude(live):
    return anthropic_client(live)


@pytest.fixture(scope="session")
def scripted_anthropic(scripted_server):
    """One client for the session (a client costs tens of milliseconds to make)."""
    return anthropic_client(scripted_server)


@pytest.fixture
def sclaude(scripted, scripted_anthropic):
    return scripted_anthropic
