"""Error dialects: which API's error object a request gets.

Errors are raised as ``OpenAIError`` everywhere, and most routes answer them in OpenAI's shape.
A family that speaks another API (Anthropic's Messages API) registers a dialect for its routes:
the paths it covers (and, optionally, a request header that selects it, for routes two APIs
share) and how it renders an error. The exception handlers and the guards in front of the app
(key, Host, body size, catch-all) all answer through ``ErrorShapes.reply``, so an error made
before any route ran still comes in the caller's API's shape. The composition root builds the
table; the core knows no family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from .errors import OpenAIError


class ErrorReply(NamedTuple):
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def openai_reply(err: OpenAIError) -> ErrorReply:
    return ErrorReply(err.status, err.body(), dict(err.headers))


@dataclass(frozen=True)
class Dialect:
    """``render`` answers errors of requests under ``prefixes`` (a path equal to one, or below it);
    with ``header`` set, only those that carry that header."""
    prefixes: tuple[str, ...]
    render: Callable[[OpenAIError], ErrorReply]
    header: str | None = None

    def covers(self, path: str, header: Callable[[str], str | None]) -> bool:
        path = path.rstrip("/") or "/"
        if not any(path == p or path.startswith(p + "/") for p in self.prefixes):
            return False
        return self.header is None or header(self.header) is not None


class ErrorShapes:
    """The dialects of one app, first match wins; OpenAI's shape for everything else."""

    def __init__(self, dialects: list[Dialect] | tuple[Dialect, ...] = ()):
        self.dialects = tuple(dialects)

    def reply(self, err: OpenAIError, path: str, header: Callable[[str], str | None]) -> ErrorReply:
        for dialect in self.dialects:
            if dialect.covers(path, header):
                return dialect.render(err)
        return openai_reply(err)


OPENAI_ONLY = ErrorShapes()
