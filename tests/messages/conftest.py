"""The Anthropic SDK's client of the standalone API, on the real model or on the scripted host."""

from __future__ import annotations

import pytest
from support.anthropic_types import anthropic_client


@pytest.fixture
def claude(live):
    return anthropic_client(live)


@pytest.fixture
def sclaude(scripted):
    return anthropic_client(scripted)
