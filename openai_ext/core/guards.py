"""ASGI guards in front of every route: the Host header check, the request body limit, and the
catch-all that turns an unexpected exception into a 500 error. Their errors take the shape of the
API the request was made to (``ErrorShapes``), as the app's own errors do.

They are plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, which would buffer
streamed responses and add a task per request.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Awaitable, Callable

import anyio
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from .bodies import ON_THREAD, check_json_text
from .dialects import OPENAI_ONLY, ErrorShapes
from .errors import (
    InvalidRequestError,
    OpenAIError,
    PermissionDeniedError,
    RequestTooLargeError,
    internal_error,
)

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


async def send_error(send: Send, err: OpenAIError, scope: Scope | None = None,
                     shapes: ErrorShapes = OPENAI_ONLY) -> None:
    """Answers ``err`` in the shape of the API that ``scope``'s request was made to. A WebSocket
    upgrade is refused with the same HTTP answer (ASGI's denial response); a server without that
    extension can only close it, which its client sees as a 403."""
    logging.getLogger("openai_ext.requests").debug("answered %d %s: %s", err.status, err.type, err.message)
    socket = scope is not None and scope.get("type") == "websocket"
    if socket and "websocket.http.response" not in (scope or {}).get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008, "reason": err.message[:120]})
        return
    if scope is None:
        status, obj, extra = err.status, err.body(), err.headers
    else:
        status, obj, extra = shapes.reply(err, scope.get("path", ""),
                                          lambda name: header(scope, name.lower().encode()))
    body = json.dumps(obj).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
    prefix = "websocket." if socket else ""
    await send({"type": prefix + "http.response.start", "status": status, "headers": headers})
    await send({"type": prefix + "http.response.body", "body": body})


def origin_refusal(origin: str | None, cors_origins: list[str], same_host: str | None = None) -> OpenAIError | None:
    """A WebSocket upgrade from a web page (one with an Origin header) is refused unless
    cors_origins lets that origin call the API: a browser lets any page open a WebSocket, without
    the CORS preflight that guards a JSON POST. With ``same_host`` (the request's Host header), a
    page of this server's own origin passes too: the Host guard has already checked that name."""
    if origin is None or "*" in cors_origins or origin in cors_origins:
        return None
    if same_host and origin.lower() in (f"http://{same_host.lower()}", f"https://{same_host.lower()}"):
        return None
    return PermissionDeniedError(f"WebSocket connections from web pages are refused unless the page's origin is in "
                                 f"the cors_origins setting; this one came from {origin!r}. Add it there to allow it.",
                                 code="origin_not_allowed")


async def refused_origin(socket: WebSocket, cors_origins: list[str], *, same_host: bool = False) -> bool:
    """Refuses a WebSocket upgrade that ``origin_refusal`` refuses (``same_host``: pages of this
    server's own origin pass), and says whether it did. The refusal is the API's error as an HTTP
    answer where the server can send one (uvicorn's websocket.http.response extension), else a
    close with the policy-violation code."""
    refusal = origin_refusal(socket.headers.get("origin"), cors_origins,
                             same_host=socket.headers.get("host") if same_host else None)
    if refusal is None:
        return False
    if "websocket.http.response" in socket.scope.get("extensions", {}):
        await socket.send_denial_response(JSONResponse(refusal.body(), status_code=refusal.status))
    else:
        await socket.close(code=1008, reason=refusal.message[:120])
    return True


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


# What a Host header may be (RFC 9110: host [":" port]): a name, an IPv4 address or a bracketed
# IPv6 address. Anything else ("localhost:5001@evil.example") names no host and matches nothing.
_HOST = re.compile(r"^(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::[0-9]{1,5})?$")


def host_name(header: str) -> str:
    """'example.com:5001' -> 'example.com'; '[::1]:5001' -> '::1'; '' for a malformed header."""
    header = header.strip().lower()
    m = _HOST.match(header)
    if m is None:
        # an IPv6 address without brackets (and so without a port), as some clients send it
        return header if header.count(":") >= 2 and re.fullmatch(r"[0-9a-f:.]+", header) else ""
    return m.group("v6") or m.group("name")


class HostGuard:
    """Defends against DNS rebinding: while the API listens on localhost only, a request (or a
    WebSocket upgrade) whose Host is some other name came through a browser tricked into calling
    it, and is refused."""

    def __init__(self, app: Any, allowed: frozenset[str], allowed_suffixes: tuple[str, ...] = (),
                 shapes: ErrorShapes = OPENAI_ONLY):
        self.app = app
        self.shapes = shapes
        self.allowed = allowed
        self.allowed_suffixes = allowed_suffixes   # e.g. the public tunnel's ".trycloudflare.com"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            name = host_name(header(scope, b"host") or "")
            if name not in self.allowed and not (self.allowed_suffixes and name.endswith(self.allowed_suffixes)):
                await send_error(send, InvalidRequestError(
                    f"Invalid Host header {name!r}: this server only answers to {', '.join(sorted(self.allowed))}. "
                    "Add the name to the allowed_hosts setting, or turn listen on."), scope, self.shapes)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuses request bodies over a limit with a 413, before the app reads them. Uploads (audio
    files) have their own, larger limit. A JSON body that is not Unicode text is refused here
    too, as is one that nests too deep or holds a number that is not finite
    (bodies.check_json_text), since this is where every body is read whole."""

    def __init__(self, app: Any, json_limit: int, upload_limit: int, upload_suffixes: tuple[str, ...],
                 streamed: tuple[tuple[str, ...], int, str] = ((), 0, ""), shapes: ErrorShapes = OPENAI_ONLY):
        self.app = app
        self.shapes = shapes
        self.json_limit = json_limit
        self.upload_limit = upload_limit
        self.upload_suffixes = upload_suffixes
        # (paths, limit, its setting): bodies counted as they pass, never held whole (a file upload)
        self.streamed = streamed

    def _limit(self, path: str) -> tuple[int, str]:
        if path.rstrip("/").endswith(self.upload_suffixes):
            # multipart adds a little around the file itself
            return self.upload_limit + 64 * 1024, f"{self.upload_limit / 2 ** 20:g} MB upload limit (max_upload_mb)"
        return self.json_limit, f"{self.json_limit / 2 ** 20:g} MB body limit (max_body_mb)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        paths, streamed_limit, setting = self.streamed
        streamed = (scope["path"].rstrip("/") or "/") in paths
        if streamed:
            limit = streamed_limit + 64 * 1024   # multipart adds a little around the file itself
            what = f"{streamed_limit / 2 ** 20:g} MB limit ({setting})"
        else:
            limit, what = self._limit(scope["path"])
        too_large = RequestTooLargeError(f"The request body is over the {what}. Send less, or raise the setting.",
                                         code="request_too_large")
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await send_error(send, too_large, scope, self.shapes)
            return
        if streamed:
            await self.app(scope, _counted(receive, limit, too_large), send)
            return
        # Read the body up to the limit (chunked bodies declare no length), then replay it to the
        # app; later receive() calls go to the client connection, so disconnects are still seen.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([], message, receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await send_error(send, too_large, scope, self.shapes)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        chunks = [b"".join(chunks)]
        # a JSON body, also where a route takes uploads (OpenAI's JSON form of some)
        if limit == self.json_limit or (header(scope, b"content-type") or "").lower().startswith("application/json"):
            try:
                if len(chunks[0]) > ON_THREAD:
                    await anyio.to_thread.run_sync(check_json_text, chunks[0])
                else:
                    check_json_text(chunks[0])
            except OpenAIError as e:
                await send_error(send, e, scope, self.shapes)
                return
        await self.app(scope, _replay(chunks, None, receive), send)


def _counted(receive: Receive, limit: int, too_large: OpenAIError) -> Receive:
    """``receive``, raising ``too_large`` (the route answers it) once the body passes ``limit``
    bytes: a body that declared no length is stopped as it grows."""
    seen = 0

    async def counted() -> dict[str, Any]:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise too_large
        return message
    return counted


def _replay(chunks: list[bytes], pending: dict[str, Any] | None, receive: Receive) -> Receive:
    first = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}] if pending is None else [pending]

    async def replay() -> dict[str, Any]:
        if first:
            return first.pop()
        return await receive()
    return replay


class CatchAll:
    """An exception that no handler took becomes a 500 OpenAI error here, inside CORS, so that a
    browser app can read it (Starlette's own last-resort handler sits outside CORS)."""

    def __init__(self, app: Any, shapes: ErrorShapes = OPENAI_ONLY):
        self.app = app
        self.shapes = shapes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - this is the last resort
            log.error("unhandled error", exc_info=exc)
            if started:
                raise   # the status line is gone: the server ends the connection
            await send_error(send, internal_error(exc), scope, self.shapes)
