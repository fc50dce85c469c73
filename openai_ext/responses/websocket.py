"""The Responses API over a WebSocket (``/v1/responses`` upgraded), as OpenAI's spec documents it
(``ResponsesClientEvent`` in, ``ResponsesWebSocketStreamEvent`` out) and its SDKs use it: the
Agents SDK's WebSocket transport, the openai SDK's ``responses.connect()``.

The client sends ``response.create`` events: the body of ``POST /v1/responses`` with ``type`` and
an optional ``stream_id``. Each is answered with the events a stream sends, as JSON text frames,
carrying the request's ``stream_id`` when it had one. A lane (one ``stream_id``, or none) serves
its requests in the order sent; lanes run side by side, and every request takes its place in
the line of requests like an HTTP one. An error before a response starts (a 400, a 404, a full
line's 429) is an ``error`` event with the HTTP status and an ``error.code`` always set, and the
connection serves on; a failure after it started ends the response with ``response.failed``.
``stream`` is implied, and ``background`` gets an error event (the spec has none here).

As Open Responses has it, the connection keeps its most recent response (one per lane) in memory, with
every item a continuation of it sees: a ``previous_response_id`` found there is continued without the
store, so ``store: false`` chains work on the socket; a continuation that fails evicts the response it
named. A connection lasts ``websocket_lifetime`` seconds (60 minutes); then what is in flight
finishes and it ends with ``websocket_connection_limit_reached``.

The upgrade passes the key and Host guards as an HTTP request does. A browser lets any page open
a WebSocket, without the CORS preflight that guards a JSON POST, so an upgrade from a page (one
with an Origin header) is refused unless ``cors_origins`` lets that origin call the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from typing import Any, Mapping

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from fastapi import WebSocket
from pydantic import ValidationError

from ..core import guards
from ..core.bodies import ON_THREAD, NotJson, load_json
from ..core.errors import (
    InvalidRequestError,
    OpenAIError,
    RateLimitError,
    from_validation_errors,
    internal_error,
)
from . import render, stream
from .item_types import Items
from .protocol import CreateResponse
from .service import ResponsesService
from .turn import Turn

log = logging.getLogger(__name__)

MAX_LANES = 16        # stream_ids open at once on one connection
MAX_WAITING = 64      # response.create events sent on one connection and not yet begun
_STREAM_ID = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
_ENVELOPE = ("type", "stream_id")


async def serve(socket: WebSocket, service: ResponsesService, owner: str) -> None:
    if await guards.refused_origin(socket, service.settings.cors_origins):
        return
    await socket.accept()
    await _Connection(socket, service, owner).run()


def _error_event(err: OpenAIError, stream_id: str | None) -> dict[str, Any]:
    payload = render.error_object(err)   # Open Responses: the code MUST be set
    if err.headers:
        payload["headers"] = dict(err.headers)
    event: dict[str, Any] = {"type": "error", "status": err.status, "error": payload}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def _body(fields: dict[str, Any]) -> CreateResponse:
    try:
        body = CreateResponse.model_validate(fields)
    except ValidationError as e:
        raise from_validation_errors([dict(x) for x in e.errors()]) from None
    if body.background:
        raise InvalidRequestError("background is not available over a WebSocket: the response streams on this "
                                  "connection. Send background responses with POST /v1/responses.",
                                  param="background")
    return body


def _lifetime_over(lifetime: float) -> InvalidRequestError:
    return InvalidRequestError(f"This WebSocket connection has reached its limit of {lifetime:g} seconds: open a new "
                               "connection, and continue there with previous_response_id (a stored response) or "
                               "with the whole context as input.", code="websocket_connection_limit_reached")


class _Recent:
    """The connection-local state: each lane's most recent response, by id, with the items a
    continuation of it sees (its chain's, its input, its output). At most one per lane (and
    lanes are bounded): it lives as long as the connection, and is never stored."""

    def __init__(self) -> None:
        self.last: dict[str | None, tuple[str, Items]] = {}

    def chain(self, response_id: str) -> Items | None:
        return next((items for rid, items in self.last.values() if rid == response_id), None)

    def keep(self, lane: str | None, response_id: str, items: Items) -> None:
        self.last[lane] = (response_id, items)

    def evict(self, response_id: str) -> None:
        for lane, (rid, _) in list(self.last.items()):
            if rid == response_id:
                del self.last[lane]


class _Connection:
    def __init__(self, socket: WebSocket, service: ResponsesService, owner: str):
        self.socket = socket
        self.service = service
        self.owner = owner
        self.send_timeout = service.settings.stream_send_timeout
        self.lifetime = service.settings.websocket_lifetime
        self.lanes: dict[str | None, MemoryObjectSendStream[dict[str, Any]]] = {}
        self.waiting = 0
        self.sending = anyio.Lock()        # one frame at a time, whichever lane it is from
        self.tasks: TaskGroup | None = None
        self.recent = _Recent()
        self.expired = False               # the lifetime is over: nothing new begins
        self.busy = 0                      # responses begun and not yet ended
        self.idle = anyio.Event()

    async def _expire(self) -> None:
        """At the end of the connection's lifetime: what is in flight finishes, then the client is
        told, and the connection ends."""
        await anyio.sleep(self.lifetime)
        self.expired = True
        while self.busy:
            self.idle = anyio.Event()
            await self.idle.wait()
        await self.send(_error_event(_lifetime_over(self.lifetime), None))
        with contextlib.suppress(Exception):
            await self.socket.close(code=1000)
        self._gone()

    async def run(self) -> None:
        async with anyio.create_task_group() as tasks:
            self.tasks = tasks
            tasks.start_soon(self._expire)
            while True:
                message = await self.socket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self.take(message)
            # the client left: the lanes' generations stop, and their responses say cancelled
            tasks.cancel_scope.cancel()

    def _gone(self) -> None:
        if self.tasks is not None:
            self.tasks.cancel_scope.cancel()

    async def send(self, event: dict[str, Any], stream_id: str | None = None) -> None:
        """One frame. A client that left, or read nothing for stream_send_timeout seconds (its
        buffers full), ends the connection: its work stops and its places in line are freed."""
        if stream_id is not None:
            event = {**event, "stream_id": stream_id}
        text = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        try:
            with anyio.fail_after(self.send_timeout):
                async with self.sending:
                    await self.socket.send_text(text)
        except Exception as e:  # noqa: BLE001 - any failure to send means the client is gone
            if isinstance(e, TimeoutError):
                log.warning("a WebSocket client read nothing for %g s: the connection was dropped and its work "
                            "stopped (stream_send_timeout)", self.send_timeout)
            self._gone()
            await anyio.lowlevel.checkpoint()   # the cancellation ends this lane here

    async def take(self, message: Mapping[str, Any]) -> None:
        """One client message: a response.create for its lane, or an error event."""
        raw = message.get("text")
        if raw is None:
            raw = message.get("bytes") or b""
        try:
            # held to a request body's rules (nesting, finite numbers, Unicode); a long one off the loop
            event = await anyio.to_thread.run_sync(load_json, raw) if len(raw) > ON_THREAD else load_json(raw)
        except NotJson:
            event = None
        except InvalidRequestError as e:
            await self.send(_error_event(e, None))
            return
        if not isinstance(event, dict):
            await self.send(_error_event(InvalidRequestError(
                "A WebSocket message must be a JSON object, such as {\"type\": \"response.create\", \"model\": ..., "
                "\"input\": ...}.", code="invalid_json"), None))
            return
        stream_id = event.get("stream_id")
        if stream_id is not None and (not isinstance(stream_id, str) or not _STREAM_ID.match(stream_id)):
            await self.send(_error_event(InvalidRequestError(
                "stream_id must be 1-256 letters, digits, dots, underscores or dashes.", param="stream_id"), None))
            return
        if event.get("type") != "response.create":
            await self.send(_error_event(InvalidRequestError(
                f"Unknown event type {event.get('type')!r}: this server takes response.create events (the body of "
                "POST /v1/responses, with type and an optional stream_id).", param="type"), stream_id))
            return
        if self.expired:
            await self.send(_error_event(_lifetime_over(self.lifetime), stream_id))
            return
        refusal = self._admit(stream_id)
        if refusal is not None:
            await self.send(_error_event(refusal, stream_id))
            return
        self.waiting += 1
        self.lanes[stream_id].send_nowait({k: v for k, v in event.items() if k not in _ENVELOPE})

    def _admit(self, stream_id: str | None) -> OpenAIError | None:
        if stream_id not in self.lanes:
            if len(self.lanes) >= MAX_LANES:
                return InvalidRequestError(f"This WebSocket connection has reached its limit of {MAX_LANES} "
                                           "stream_ids; reuse one, or open another connection.", param="stream_id",
                                           code="websocket_stream_limit_reached")
            sender, receiver = anyio.create_memory_object_stream[dict[str, Any]](math.inf)
            self.lanes[stream_id] = sender
            assert self.tasks is not None
            self.tasks.start_soon(self._lane, stream_id, receiver)
        if self.waiting >= MAX_WAITING:
            return RateLimitError(f"{MAX_WAITING} requests already wait on this WebSocket connection; wait for "
                                  "their responses before sending more.", code="websocket_queue_full")
        return None

    async def _lane(self, stream_id: str | None, requests: MemoryObjectReceiveStream[dict[str, Any]]) -> None:
        async with requests:
            async for fields in requests:
                self.waiting -= 1
                await self._respond(fields, stream_id)

    async def _respond(self, fields: dict[str, Any], stream_id: str | None) -> None:
        if self.expired:
            await self.send(_error_event(_lifetime_over(self.lifetime), stream_id))
            return
        self.busy += 1
        try:
            await self._run(fields, stream_id)
        finally:
            self.busy -= 1
            if not self.busy:
                self.idle.set()

    async def _run(self, fields: dict[str, Any], stream_id: str | None) -> None:
        previous = fields.get("previous_response_id")
        previous = previous if isinstance(previous, str) else None
        try:
            turn, place = await self.service.begin(_body(fields), self.owner, self.recent.chain)
        except Exception as e:  # noqa: BLE001 - the client gets an error event, the connection serves on
            if previous is not None:   # a continuation that fails evicts what it continued (Open Responses)
                self.recent.evict(previous)
            if not isinstance(e, OpenAIError):
                log.exception("preparing a WebSocket response failed")
            await self.send(_error_event(e if isinstance(e, OpenAIError) else internal_error(e), stream_id))
            return
        try:
            events = stream.events(turn.text, turn, place)
            async with contextlib.aclosing(events):
                async for event in events:
                    await self.send(event, stream_id)
        except Exception as e:  # noqa: BLE001 - the response ends as failed, the connection serves on
            if not isinstance(e, OpenAIError):
                log.exception("a WebSocket response failed")
            turn.fail(e)   # already done by events() when it failed there
            await self.send(turn.event("response.failed", response=turn.state.snapshot()), stream_id)
        finally:
            place.release()
            if not turn.settled:   # cancelled before its events began
                turn.fail(asyncio.CancelledError())
                await turn.settle()
            self._remember(turn, stream_id, previous)

    def _remember(self, turn: Turn, stream_id: str | None, previous: str | None) -> None:
        """A response that ended well becomes its lane's most recent one; one that failed evicts
        the response it continued."""
        state = turn.state
        if state.status in ("completed", "incomplete"):
            record = turn.record
            self.recent.keep(stream_id, state.id, [*turn.before, *(record.input if record else []), *state.output])
        elif previous is not None:
            self.recent.evict(previous)
