"""Server-sent events and client disconnects, shared by every family that streams or runs long.

- ``event_stream`` frames chunks as OpenAI does (``data: {json}``, then ``data: [DONE]``); an
  error after the stream began becomes an error event. ``framing`` lets another API family
  (Anthropic's named events, say) write its own frames over the same machinery, its keep-alive
  pings included (``Framing.keepalive``; OpenAI's are SSE comments).
- ``EventStream`` gives up on a client that stopped reading, and runs ``on_close`` once the
  response is over, however it ended: that is where a stream gives back its place in line
  (``ClosingStream`` does the same for a plain streamed body).
- ``until_disconnect`` cancels the work of a non-streamed request whose client went away.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import json
import logging
from typing import Any, AsyncGenerator, Awaitable, Callable

import anyio
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus

from .drain import Drain
from .errors import OpenAIError, ServiceUnavailableError, internal_error_body

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
_SSE_PARAMETERS = inspect.signature(EventSourceResponse.__init__).parameters
_HAS_SHUTDOWN_EVENT = "shutdown_grace_period" in _SSE_PARAMETERS
# Where sse-starlette has send_timeout, it bounds each event's send itself; 1.6 (the web UI pins
# it) has none, and EventStream bounds every send there. Where it sends events and pings through
# _send_with_timeout (3.x), EventStream bounds them its own way (see there).
_HAS_SEND_TIMEOUT = "send_timeout" in _SSE_PARAMETERS
_SENDS_THROUGH_METHOD = hasattr(EventSourceResponse, "_send_with_timeout")
PING_SECONDS = 15


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))   # made once, not once an event


def dumps(obj: Any) -> bytes:
    return _ENCODER.encode(obj).encode()


def sse_event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


class Framed(bytes):
    """A chunk its family has already written as OpenAI's frame (``data: {json}``), sent as it is
    (text/render.ContentFrames)."""


class Framing:
    """How a family writes its stream: each chunk, an error after the stream began, its end,
    and its keep-alive pings."""

    @property
    def ping_seconds(self) -> float:
        """Seconds between keep-alive pings (read when a stream starts)."""
        return PING_SECONDS

    def frame(self, chunk: Any) -> bytes:
        raise NotImplementedError

    def error(self, error: OpenAIError | None, exc: BaseException) -> bytes:
        raise NotImplementedError

    def end(self) -> bytes:
        return b""

    def keepalive(self) -> Callable[[], bytes] | None:
        """What a ping is made by; None: an SSE comment line, which every client skips."""
        return None


class OpenAIFraming(Framing):
    """OpenAI's framing: every chunk and error as ``data:``, then ``data: [DONE]`` (OpenAI's
    audio streams end without it: ``done=False``)."""

    def __init__(self, done: bool = True):
        self.done = done

    def frame(self, chunk: Any) -> bytes:
        return chunk if type(chunk) is Framed else sse_event(chunk)

    def error(self, error: OpenAIError | None, exc: BaseException) -> bytes:
        return sse_event(error.body() if error is not None else internal_error_body(exc))

    def end(self) -> bytes:
        return DONE if self.done else b""


SHUTTING_DOWN = ("The server is shutting down; this stream was ended early. Send the request again once the "
                 "server is back.")


# Chunks a stream's work may make before its client takes them; then the work waits for it.
AHEAD = 4


async def _until_drained(chunks: AsyncGenerator[Any, None], drained: asyncio.Event) -> AsyncGenerator[Any, None]:
    """``chunks`` until the server begins to shut down; then ServiceUnavailableError.

    ``chunks`` runs in a task of its own, at most AHEAD chunks ahead of the client, so that the
    stream can end at once when the server drains, and so that the work under ``chunks`` is
    stopped by a single cancel and can finish its cleanup: the response's own task is cancelled
    again at every await once its client has left. One task a stream: a task a chunk cost more
    than the rest of the way to the socket."""
    loop = asyncio.get_running_loop()
    ready: collections.deque[Any] = collections.deque()
    waiter: asyncio.Future[None] | None = None   # the reader's, while nothing is ready
    room: asyncio.Future[None] | None = None     # the work's, while AHEAD chunks wait

    def wake(_: Any = None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def pump() -> None:
        nonlocal room
        try:
            async for chunk in chunks:
                ready.append(chunk)
                wake()
                while len(ready) >= AHEAD:
                    room = loop.create_future()
                    await room
        finally:
            await chunks.aclose()   # here, not in the response's task (see above)

    work = loop.create_task(pump())
    work.add_done_callback(wake)
    stop = asyncio.ensure_future(drained.wait())
    stop.add_done_callback(wake)
    try:
        while True:
            if drained.is_set():
                raise ServiceUnavailableError(SHUTTING_DOWN, code="server_shutting_down")
            if ready:
                chunk = ready.popleft()
                if room is not None and not room.done():
                    room.set_result(None)
                yield chunk
            elif work.done():
                if work.cancelled():   # only the loop itself cancels it: the server is stopping
                    raise ServiceUnavailableError(SHUTTING_DOWN, code="server_shutting_down")
                work.result()   # the work's failure, raised here
                return
            else:
                waiter = loop.create_future()
                await waiter
    finally:
        stop.cancel()
        if not work.done():
            # The client left, or the server is stopping: the work under ``chunks`` is stopped
            # and waited for (a generation gives the model back only once it has stopped).
            work.cancel()
            with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                await work


async def sse_stream(chunks: AsyncGenerator[Any, None], framing: Framing | None = None,
                     drain: Drain | None = None) -> AsyncGenerator[bytes, None]:
    """Frames ``chunks``. An error after the stream began becomes an error event, and the
    stream still ends as its framing says; so does a stream open when the server shuts down."""
    framing = framing or OpenAIFraming()
    source = chunks if drain is None else _until_drained(chunks, drain.event())
    try:
        async for chunk in source:
            yield framing.frame(chunk)
    except OpenAIError as e:
        yield framing.error(e, e)
    except Exception as e:  # noqa: BLE001 - the client must get an error object, not a cut stream
        log.exception("stream failed")
        yield framing.error(None, e)
    finally:
        if source is not chunks:
            await source.aclose()
        await chunks.aclose()
    end = framing.end()
    if end:
        yield end


# Set, in the request's own context, when a stream is dropped on purpose (a client that reads
# nothing): the server then ends the connection without completing the response, which uvicorn
# would log as an error. uvicorn logs it from the same task, after the app returns, so the flag
# is still there for DroppedOnPurpose to see.
_dropped: contextvars.ContextVar[bool] = contextvars.ContextVar("stream_dropped", default=False)


class DroppedOnPurpose(logging.Filter):
    """Keeps uvicorn's "returned without completing response" error for real faults only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_dropped.get() and record.msg == "ASGI callable returned without completing response.")


DROPPED_ON_PURPOSE = DroppedOnPurpose()


class SendTimeout(TimeoutError):
    """A send to the client made no progress for the stream's send_timeout."""


class EventStream(EventSourceResponse):
    """An event stream (a generation's, a transcription's) that gives up on a client that
    stopped reading, and calls ``on_close`` when it is over.

    Such a client fills the socket's buffers, the send then waits, and the work waits with
    it, holding its place in line or the model's turn: everyone else would wait for a client
    that may never read again. After ``send_timeout`` seconds without progress the stream is
    closed, which stops the work and frees its place; the server then drops the connection.

    It works on sse-starlette 1.6 (the web UI pins it) as on 3.x. Every send is bounded once: on
    3.x an event's or a ping's by a timer (``_send_with_timeout``), where sse-starlette's own bound,
    a cancel scope for each send, took a fifth of the event loop's time a token; on versions with
    a send_timeout but without that method, by sse-starlette; any other send (every send on 1.6)
    by a cancel scope here. On 1.x the wait for the server's exit does not use that version's
    process-wide event, which binds to the first event loop that waits on it and breaks streams
    of any other server in the process (the web UI's own API)."""

    def __init__(self, chunks: AsyncGenerator[Any, None], framing: Framing | None = None, *,
                 on_close: Callable[[], None] | None = None, send_timeout: float | None = None, **kwargs: Any):
        if _HAS_SHUTDOWN_EVENT:
            # sse-starlette 3.3+ cancels open streams when it sees the server stop; the grace
            # lets the stream send its closing error event first (see core/drain.py).
            kwargs.setdefault("shutdown_grace_period", 2.0)
        if _HAS_SEND_TIMEOUT:
            kwargs["send_timeout"] = send_timeout
        super().__init__(self._frames(chunks, framing), **kwargs)
        self._on_close = on_close
        self._drain: Drain | None = None
        self.send_timeout = send_timeout
        # Kept from __call__ for every send's timer: asking for the running loop each time costs a
        # system call on Python 3.11 (it checks the process id).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._whole = anyio.CancelScope()   # the response: cancelled when a send stalls
        self._stalled = False
        if hasattr(EventSourceResponse, "listen_for_exit_signal"):   # sse-starlette 1.x
            self.listen_for_exit_signal = _exit_signal

    async def _send_with_timeout(self, send: Any, message: Any) -> None:
        """An event's or a ping's send (sse-starlette 3.x). A timer, set for each send and
        cancelled after it, drops the stream when a send makes no progress for send_timeout."""
        if not self.send_timeout or self._loop is None:
            await send(message)
            return
        timer = self._loop.call_later(self.send_timeout, self._stall)
        try:
            await send(message)
        finally:
            timer.cancel()

    def _stall(self) -> None:
        self._stalled = True
        self._whole.cancel()

    async def _frames(self, chunks: AsyncGenerator[Any, None],
                      framing: Framing | None) -> AsyncGenerator[bytes, None]:
        # Built when the response starts, so the app's drain (known from the scope) is in place.
        async for frame in sse_stream(chunks, framing, self._drain):
            yield frame

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = scope.get("app")
        self._drain = getattr(getattr(app, "state", None), "drain", None)
        if _HAS_SHUTDOWN_EVENT and isinstance(self._drain, Drain):
            # sse-starlette cancels a stream its grace after the server begins to stop; the
            # stream ends itself at once (the drain) but may first wait for its step to stop,
            # so the server's own grace is the bound, not sse-starlette's 2 s.
            self._shutdown_grace_period = max(2.0, self._drain.grace)

        async def timed_send(message: Any) -> None:
            if (_SENDS_THROUGH_METHOD or _HAS_SEND_TIMEOUT) and message.get("more_body"):
                return await send(message)   # an event or a ping: bounded already (see above)
            with anyio.move_on_after(self.send_timeout) as scope_:
                await send(message)
            if scope_.cancel_called:
                raise SendTimeout()

        self._loop = asyncio.get_running_loop()
        try:
            with self._whole:
                await super().__call__(scope, receive, timed_send if self.send_timeout else send)
            if self._stalled:
                raise SendTimeout()
        except BaseException as e:
            if not _only_send_timeouts(e):
                raise
            _dropped.set(True)
            log.warning("a client read nothing of its stream for %g s: the stream was dropped and its "
                        "work stopped (stream_send_timeout)", self.send_timeout)
        finally:
            # sse-starlette 1.x leaves the content unclosed when a send fails: closing it stops the work.
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
            # A client that left before the first event never started the generator, so its
            # own cleanup never ran: what it holds is given back here.
            if self._on_close is not None:
                self._on_close()


async def _exit_signal() -> None:
    """sse-starlette 1.x's wait for the server's exit, on a flag instead of its shared event."""
    while not AppStatus.should_exit:
        await anyio.sleep(0.5)


class ClosingStream(StreamingResponse):
    """A streamed body (audio) that calls ``on_close`` once the response is over, however it
    ended, for the same reason as EventStream."""

    def __init__(self, content: Any, *, on_close: Callable[[], None], **kwargs: Any):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def _only_send_timeouts(error: BaseException) -> bool:
    # sse-starlette raises the timeout bare (3.1+) or inside its task group's exception group
    # (a builtin from Python 3.11, anyio's backport before: both hold .exceptions)
    inner = getattr(error, "exceptions", None)
    if isinstance(inner, (list, tuple)) and inner:
        return all(_only_send_timeouts(e) for e in inner)
    return isinstance(error, SendTimeout) or type(error).__name__ == "SendTimeoutError"


def event_stream(chunks: AsyncGenerator[Any, None], send_timeout: float | None = None, *,
                 framing: Framing | None = None,
                 on_close: Callable[[], None] | None = None, ping: float | None = None,
                 headers: dict[str, str] | None = None) -> EventSourceResponse:
    """``ping``: seconds between keep-alive pings (default: the framing's ``ping_seconds``, else
    PING_SECONDS)."""
    framing = framing or OpenAIFraming()
    if ping is None:
        ping = framing.ping_seconds
    return EventStream(chunks, framing, sep="\n", ping=ping, send_timeout=send_timeout,
                       on_close=on_close, headers=headers, ping_message_factory=framing.keepalive())


async def until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Runs ``work``; if the client goes away first, cancels it, which stops its generation.

    The cancel is anyio's (a cancel scope), not a bare task cancel: work that is shielded from it
    (a blocking call on a worker thread, a host that is stopping) is waited for, so the request's
    turn passes on only once that work has really ended, and nothing is closed under a thread
    that still runs it."""
    scope = anyio.CancelScope()
    left = object()

    async def run() -> Any:
        with scope:
            return await work
        return left   # the scope was cancelled: the client left

    task = asyncio.ensure_future(run())

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        result = await task
    finally:
        watcher.cancel()
    if result is left:
        log.info("client disconnected; its work was stopped")
        return Response(status_code=499)
    return result
