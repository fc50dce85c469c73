"""Errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}, "request_id"}``.

The server raises the same errors on every route; this renders them as Anthropic does, with
its statuses and types. A full generation queue is ``overloaded_error`` with Anthropic's 529
(its SDKs retry it, as they retry OpenAI's 429), Anthropic's 413 is ``request_too_large``, and
a 504 (an upstream or an MCP server that did not answer in time) is ``timeout_error``.
The composition root registers ``reply`` as the error dialect of the Messages routes (and of
/v1/models for requests with anthropic-version), so errors raised before any route ran (a
missing key, a body over the limit, a wrong Host) come in this shape too.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..core.dialects import ErrorReply
from ..core.errors import OpenAIError

OVERLOADED = 529

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
          504: "timeout_error", OVERLOADED: "overloaded_error"}

# Anthropic's error.details.error_code, on the errors Anthropic's SDKs act on: a thread the server
# does not hold, or holds as continued already, is replayed whole under a new thread (threads.py).
DETAILED = {"thread_not_found", "thread_already_continued"}

# Reworded where the OpenAI wording names OpenAI's header: Anthropic's clients send x-api-key.
_MESSAGES = {"invalid_api_key": "Invalid API key. Send it as 'x-api-key: <key>' (or 'Authorization: Bearer <key>')."}


def status_and_type(err: OpenAIError) -> tuple[int, str]:
    if err.status == 429 and err.code == "queue_full":
        return OVERLOADED, "overloaded_error"
    kind = _TYPES.get(err.status) or ("invalid_request_error" if err.status < 500 else "api_error")
    return err.status, kind


def body(err: OpenAIError) -> dict[str, Any]:
    _, kind = status_and_type(err)
    message = _MESSAGES.get(err.code or "", err.message) if err.status == 401 else err.message
    error: dict[str, Any] = {"type": kind, "message": message}
    if err.code in DETAILED:
        error["details"] = {"error_code": err.code}
    return {"type": "error", "error": error, "request_id": f"req_{uuid.uuid4().hex[:24]}"}


def reply(err: OpenAIError) -> ErrorReply:
    status, _ = status_and_type(err)
    return ErrorReply(status, body(err), dict(err.headers))
