"""OpenAI's list envelope for cursor pagination, shared by every family that lists stored objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def cursor_page(data: Sequence[Mapping[str, Any]], has_more: bool) -> dict[str, Any]:
    """``{"object": "list", "data", "first_id", "last_id", "has_more"}``; the ids are null on an
    empty page, as OpenAI answers."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}
