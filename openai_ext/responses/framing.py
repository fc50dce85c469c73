"""How a Responses stream is framed on the wire: named SSE events, an error after the stream began
as ``error`` plus ``response.failed``, ``data: [DONE]`` last; and stored events streamed again."""

from __future__ import annotations

from typing import Any, AsyncGenerator

from ..core import streaming
from ..core.errors import OpenAIError, internal_error
from ..core.streaming import dumps
from . import render
from .turn import Turn


def failure_events(turn: Turn, err: OpenAIError | None, exc: BaseException) -> list[dict[str, Any]]:
    """What ends a stream that failed after it began: an ``error`` event and ``response.failed``."""
    error = err if err is not None else internal_error(exc)
    turn.fail(error)
    return [turn.event("error", **render.error_fields(error)),
            turn.event("response.failed", response=turn.state.snapshot())]


def frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + dumps(event) + b"\n\n"


class Framing(streaming.Framing):
    """The framing of a Responses stream for core.streaming.event_stream: named events, an error
    as ``error`` plus ``response.failed``, and ``data: [DONE]`` last. OpenAI sends no ``[DONE]``
    here, but Open Responses requires it, and OpenAI's SDKs (and the other clients read for it)
    end the stream there."""

    def __init__(self, turn: Turn | None):
        self.turn = turn   # None: a replay of stored events, which has no response to fail

    def frame(self, event: dict[str, Any]) -> bytes:
        return frame(event)

    def error(self, err: OpenAIError | None, exc: BaseException) -> bytes:
        if self.turn is None:
            error = err if err is not None else internal_error(exc)
            return frame({"type": "error", **render.error_fields(error), "sequence_number": 0})
        return b"".join(frame(e) for e in failure_events(self.turn, err, exc))

    def end(self) -> bytes:
        return streaming.DONE


async def replay(events: list[dict[str, Any]]) -> AsyncGenerator[dict[str, Any], None]:
    """Stored events, as a stream again."""
    for event in events:
        yield event
