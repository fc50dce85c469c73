"""The Anthropic SDK's client of the standalone API on the real model."""

from __future__ import annotations

import pytest
from support.anthropic_types import anthropic_client


@pytest.fixture
def claude(live):
    return anthropic_client(live)
