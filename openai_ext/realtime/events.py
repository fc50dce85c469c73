"""The envelope of the Realtime protocol: ids, server events, ``error`` events, and the reading
of a client's frame into an event (OpenAI's ``RealtimeClientEvent`` union).

Every server event carries its own ``event_id``; an ``error`` answers a client event and names
that event's ``event_id``, so a client can tell which of its events failed. Errors are the API's
own objects (core.errors), carried in the event's ``error``; the session goes on after them.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..core.api_model import ApiModel, allowed
from ..core.bodies import NotJson, load_json
from ..core.errors import InvalidRequestError, OpenAIError

MAX_EVENT_ID = 512


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def event(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "event_id": new_id("event"), **fields}


def error_event(err: OpenAIError, client_event_id: str | None = None) -> dict[str, Any]:
    return event("error", error={"type": err.type, "code": err.code, "message": err.message, "param": err.param,
                                 "event_id": client_event_id})


class ClientEventError(InvalidRequestError):
    """A client event that cannot be taken; the ``error`` event names the event's id."""

    def __init__(self, message: str, *, event_id: str | None = None, param: str | None = None,
                 code: str | None = "invalid_value"):
        super().__init__(message, param=param, code=code)
        self.event_id = event_id


class _Event(ApiModel):
    """A client event's top-level fields (OpenAI's RealtimeClientEvent*), for their names only:
    each handler reads and checks its values, naming the field in an error event."""
    type: Any = None
    event_id: Any = None


class _SessionUpdate(_Event):
    session: Any = None


class _Append(_Event):
    audio: Any = None


class _ItemCreate(_Event):
    previous_item_id: Any = None
    item: Any = None


class _ItemId(_Event):
    item_id: Any = None


class _Truncate(_ItemId):
    content_index: Any = None
    audio_end_ms: Any = None


class _ResponseCreate(_Event):
    response: Any = None


class _ResponseCancel(_Event):
    response_id: Any = None


SHAPES: dict[str, type[ApiModel]] = {
    "session.update": _SessionUpdate, "input_audio_buffer.append": _Append, "input_audio_buffer.commit": _Event,
    "input_audio_buffer.clear": _Event, "conversation.item.create": _ItemCreate,
    "conversation.item.retrieve": _ItemId, "conversation.item.delete": _ItemId,
    "conversation.item.truncate": _Truncate, "response.create": _ResponseCreate,
    "response.cancel": _ResponseCancel, "output_audio_buffer.clear": _Event,
}
CLIENT_EVENTS = tuple(SHAPES)   # the client events this server takes, as OpenAI's spec names them


def parse(raw: str | bytes, limit: int) -> dict[str, Any]:
    """One frame as a client event: a JSON object with a known ``type`` and an optional
    ``event_id`` (checked here), and no field its type does not have (unless the
    allow_unknown_fields setting is on). ``limit``: the largest frame taken, in bytes."""
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > limit:
        raise ClientEventError(f"This event is {size} bytes; the limit is {limit} (the realtime_max_frame_kb "
                               "setting). Send audio in smaller input_audio_buffer.append events.",
                               code="event_too_large")
    try:
        doc = load_json(raw)   # held to a request body's rules: nesting, finite numbers, Unicode
    except NotJson as e:
        raise ClientEventError(f"The event is not valid JSON ({e.reason}). Send one JSON object per message, such "
                               'as {"type": "response.create"}.', code="invalid_json") from None
    except InvalidRequestError as e:
        raise ClientEventError(e.message, param=e.param, code=e.code) from None
    if not isinstance(doc, dict):
        raise ClientEventError('An event must be a JSON object with a "type", such as {"type": "response.create"}.',
                               code="invalid_json")
    event_id = doc.get("event_id")
    if event_id is not None and (not isinstance(event_id, str) or len(event_id) > MAX_EVENT_ID):
        raise ClientEventError(f"'event_id' must be a string of at most {MAX_EVENT_ID} characters.",
                               param="event_id")
    kind = doc.get("type")
    if kind not in CLIENT_EVENTS:
        raise ClientEventError(f"Unknown event type {kind!r}. This server takes: {', '.join(CLIENT_EVENTS)}.",
                               event_id=event_id, param="type", code="invalid_event_type" if kind else
                               "missing_required_parameter")
    try:
        SHAPES[kind].refuse_unknown_in(doc, allow=allowed())
    except InvalidRequestError as e:
        raise ClientEventError(e.message, event_id=event_id, param=e.param, code=e.code) from None
    return doc


def field(doc: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = False,
          where: str = "") -> Any:
    """``doc[name]`` checked to be of ``kind`` (None when absent and not required)."""
    value = doc.get(name)
    param = f"{where}.{name}" if where else name
    if value is None:
        if required:
            raise ClientEventError(f"'{param}' is required.", param=param, code="missing_required_parameter")
        return None
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ClientEventError(f"'{param}' has the wrong type: {value!r}.", param=param)
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ClientEventError(f"'{param}' must be of type {names}, not {type(value).__name__}.", param=param,
                               code="invalid_type")
    return value
