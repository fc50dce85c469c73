"""What --debug shows: each request's body and each error's message, with secrets redacted and
long texts cut, so a user can see why a request was refused. Stream chunks (thousands per run)
are left to a second level, debug_streams.

The request log is an ASGI guard that looks at the body as the app receives it (it is read
whole by BodyLimit just before), so it costs nothing when debug is off: it is not installed."""

from __future__ import annotations

import json
import logging
from typing import Any

from .guards import Receive, Scope, Send, header

log = logging.getLogger("openai_ext.requests")

TEXT_CUT = 200      # characters of a string shown
LIST_CUT = 20       # items of a list shown
SECRET_WORDS = ("key", "token", "secret", "password", "authorization", "auth")


def redact(value: Any, *, name: str = "") -> Any:
    """A copy fit for a log: values of secret-looking fields hidden, long strings and lists cut."""
    if name and any(word in name.lower() for word in SECRET_WORDS) and isinstance(value, (str, int)):
        return "***"
    if isinstance(value, str):
        return value if len(value) <= TEXT_CUT else f"{value[:TEXT_CUT]}...(+{len(value) - TEXT_CUT} chars)"
    if isinstance(value, dict):
        return {k: redact(v, name=str(k)) for k, v in value.items()}
    if isinstance(value, list):
        shown = [redact(v) for v in value[:LIST_CUT]]
        return shown + [f"...(+{len(value) - LIST_CUT} items)"] if len(value) > LIST_CUT else shown
    return value


def describe_body(body: bytes, content_type: str) -> str:
    if not body:
        return "no body"
    if content_type.startswith("multipart/form-data"):
        return f"multipart form, {len(body)} bytes"
    try:
        return json.dumps(redact(json.loads(body)), ensure_ascii=False)
    except (ValueError, RecursionError):
        return f"{len(body)} bytes, not JSON"


class RequestLog:
    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.DEBUG):
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        content_type = (header(scope, b"content-type") or "").lower()
        logged = False

        async def logging_receive() -> dict[str, Any]:
            nonlocal logged
            message = await receive()
            if not logged and message["type"] == "http.request":
                logged = True
                # BodyLimit hands the app the whole body in one message
                log.debug("%s %s: %s", method, path, describe_body(message.get("body", b""), content_type))
            return message

        if method in ("GET", "HEAD", "OPTIONS", "DELETE"):
            log.debug("%s %s", method, path)
            await self.app(scope, receive, send)
        else:
            await self.app(scope, logging_receive, send)


def configure(debug: bool, streams: bool) -> None:
    """The one place that sets the levels of this server's loggers: DEBUG for its own with debug
    (INFO otherwise), and for the SSE library's per-chunk lines only with debug_streams."""
    # INFO, not the parent's level: in extension mode the web UI's root logger stops at ERROR, and
    # this server's warnings (a prompt cut, a stream dropped) must still be seen
    logging.getLogger("openai_ext").setLevel(logging.DEBUG if debug else logging.INFO)
    logging.getLogger("sse_starlette").setLevel(logging.DEBUG if debug and streams else logging.INFO)
