"""What --debug shows: each request's body and each error's message, with secrets redacted and
long texts cut, so a user can see why a request was refused. Stream chunks (thousands per run)
are left to a second level, debug_streams.

The request log is an ASGI guard that looks at the body as the app receives it (it is read
whole by BodyLimit just before), so it costs nothing when debug is off: it is not installed."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from .guards import Receive, Scope, Send, header

log = logging.getLogger("openai_ext.requests")

TEXT_CUT = 200      # characters of a string shown
LIST_CUT = 20       # items of a list shown
# A field is a secret when a word of its name says so: api_key, admin_key, x-api-key,
# Authorization, access_token, client_secret, password. Words, not substrings: max_tokens and
# max_completion_tokens count tokens, prompt_cache_key names a cache, and a log that hides them
# hides what the user needs to see.
SECRET_WORDS = frozenset({"secret", "secrets", "password", "passwd", "passphrase", "authorization", "auth",
                          "cookie", "credential", "credentials", "apikey", "bearer", "token"})
SECRET_KEYS = frozenset({"api", "access", "admin", "auth", "private", "secret", "signing", "session"})
_WORD = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret(name: str) -> bool:
    words = [w.lower() for w in _WORD.split(name) if w]
    return bool(SECRET_WORDS.intersection(words)) or ("key" in words and (len(words) == 1 or
                                                                          bool(SECRET_KEYS.intersection(words))))


def redact(value: Any, *, name: str = "") -> Any:
    """A copy fit for a log: values of secret-looking fields hidden, long strings and lists cut."""
    if name and is_secret(name) and isinstance(value, (str, int)):
        return "***"
    if name == "headers" and isinstance(value, dict):
        # headers a client gives this server to send on (an mcp tool's): any may carry a credential
        return {k: "***" for k in value}
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
