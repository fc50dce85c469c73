"""Strict checks of Messages API bodies and events against the official anthropic SDK's types.

Every object is validated in pydantic's strict mode (from its JSON, so timestamps may be the
strings Anthropic sends), and every key must be one the SDK's type declares: the SDK's models
allow extra keys, so an unknown one would otherwise pass silently.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
from pydantic import TypeAdapter


def anthropic_client(server, **kw):
    import anthropic

    return anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key=kw.pop("api_key", "dummy"),
                               max_retries=0, _strict_response_validation=True, timeout=kw.pop("timeout", 120), **kw)


def no_unknown_keys(value: Any, path: str = "$") -> None:
    if isinstance(value, pydantic.BaseModel):
        extra = value.model_extra or {}
        assert not extra, f"{path}: keys unknown to {type(value).__name__}: {sorted(extra)}"
        for name in type(value).model_fields:
            no_unknown_keys(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            no_unknown_keys(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            no_unknown_keys(item, f"{path}.{key}")


def strict(type_: Any, obj: Any) -> Any:
    """``obj`` validated strictly as ``type_``, with no key the type does not declare."""
    value = TypeAdapter(type_).validate_json(json.dumps(obj), strict=True)
    no_unknown_keys(value)
    return value


def assert_message(obj: dict[str, Any], *, beta: bool = False):
    """A Message; ``beta``: the beta Message, for the fields only beta requests get back
    (context_management)."""
    from anthropic.types import Message
    from anthropic.types.beta import BetaMessage

    return strict(BetaMessage if beta else Message, obj)


def assert_error(obj: dict[str, Any], kind: str, *, code: str | None = None) -> None:
    """Anthropic's error object, of type ``kind``; with ``code``, its ``details.error_code`` (the
    details are checked against the SDK's ErrorDetails). request_too_large is Anthropic's
    documented type for 413, which the SDK's ErrorObject union does not list: its shape is
    checked as such."""
    from anthropic.types.shared import ErrorResponse
    from anthropic.types.shared.error_details import ErrorDetails

    assert obj["type"] == "error" and obj["error"]["type"] == kind, obj
    if code is not None:
        obj = {**obj, "error": dict(obj["error"])}
        details = obj["error"].pop("details")
        assert strict(ErrorDetails, details).error_code == code, details
    assert isinstance(obj["error"]["message"], str) and obj["error"]["message"]
    if kind == "request_too_large":
        assert set(obj) == {"type", "error", "request_id"} and set(obj["error"]) == {"type", "message"}
    else:
        strict(ErrorResponse, obj)
    assert "detail" not in obj


def parse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event; each must have both, and agree."""
    out = []
    for frame in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in frame.split("\n"):
            if line.startswith(":"):
                raise AssertionError(f"an SSE comment in an Anthropic stream: {line!r}")
            name, _, value = line.partition(": ")
            fields[name] = value
        assert set(fields) == {"event", "data"}, frame
        data = json.loads(fields["data"])
        assert data["type"] == fields["event"], frame
        out.append((fields["event"], data))
    return out


def assert_events(text: str, *, beta: bool = False) -> list[dict[str, Any]]:
    """Validates a whole stream: every event strictly (``beta``: as the beta events), and their
    order (message_start first, then blocks opened, filled and closed one at a time with rising
    indices, then message_delta and message_stop; pings anywhere after the start). Returns the
    events, pings left out."""
    from anthropic.types import RawMessageStreamEvent
    from anthropic.types.beta import BetaRawMessageStreamEvent

    events = parse_events(text)
    assert events and events[0][0] == "message_start", events[:1]
    out, open_index, next_index = [], None, 0
    names = [name for name, _ in events if name != "ping"]
    assert names[-2:] == ["message_delta", "message_stop"], names[-3:]
    for name, data in events:
        if name == "ping":
            assert data == {"type": "ping"}
            continue
        strict(BetaRawMessageStreamEvent if beta else RawMessageStreamEvent, data)
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index, (open_index, data)
            open_index, next_index = data["index"], next_index + 1
        elif name == "content_block_delta":
            assert data["index"] == open_index, data
        elif name == "content_block_stop":
            assert data["index"] == open_index, data
            open_index = None
        elif name in ("message_delta", "message_stop"):
            assert open_index is None, "a block still open at the end"
        out.append(data)
    assert names.count("message_start") == 1 and names.count("message_stop") == 1
    return out


def fold_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"]["text"] for e in events
                   if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta")
