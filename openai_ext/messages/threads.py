"""Threads: conversations the server holds between turns (the request's ``thread``).

``{"type": "create"}`` is answered as any request, and its whole conversation (system, tools,
messages and the reply) is kept under the reply's id. ``{"type": "continue",
"previous_message_id": id}`` sends only the new turn's messages, without system and tools: it
is answered as if it had sent the kept conversation, its system and its tools, followed by its
own messages; every other field is the request's own. Each reply is continued once: its
conversation then moves to the new reply's id, and the old id answers thread_already_continued.

Kept in memory for the server's lifetime, per API key: the newest threads up to a count and a
size, the oldest dropped first. A continue whose thread is gone (dropped, from another key, or
before a restart) gets thread_not_found (404), on which Anthropic's SDK sends the whole
conversation again under a new thread, as it does on thread_already_continued. Both carry
Anthropic's ``error.details.error_code`` (errors.py).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..core.errors import InvalidRequestError, NotFoundError
from .protocol import InputMessage, MessagesRequest, TextBlock, Thread, parse

MAX_THREADS = 512
MAX_CHARS = 64_000_000    # the kept conversations' JSON, all together


@dataclass
class _Kept:
    owner: str
    system: Any
    tools: Any
    messages: list[InputMessage] | None    # None once continued: only the mark is kept
    size: int


class Ticket:
    """Where a threaded request's reply goes: ``commit`` keeps the conversation under its id."""

    def __init__(self, threads: Threads, owner: str, previous: str | None, req: MessagesRequest):
        self.threads, self.owner, self.previous, self.req = threads, owner, previous, req

    def commit(self, message_id: str, content: list[dict[str, Any]]) -> None:
        self.threads._keep(self, message_id, with_reply(self.req.messages, content))


@dataclass(frozen=True)
class Asked:
    """A Messages request as it is answered: the whole request (a thread's conversation put back
    in front of a continued one), and the ticket its reply is kept by (None: not threaded)."""
    request: MessagesRequest
    ticket: Ticket | None = None


class Threads:
    def __init__(self, max_threads: int | None = None, max_chars: int | None = None):
        self.max_threads = max_threads or MAX_THREADS
        self.max_chars = max_chars or MAX_CHARS
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._chars = 0

    def resolve(self, req: MessagesRequest, owner: str) -> Asked:
        """The whole request a threaded one stands for, with the ticket its reply is kept by."""
        if req.thread is None:
            return Asked(req)
        thread = parse(Thread, req.thread, "thread")
        previous = None
        if thread.type == "continue":
            for name in ("system", "tools"):
                if getattr(req, name) is not None:
                    raise InvalidRequestError(
                        f"{name} is kept by the thread and cannot be sent with thread type 'continue'. Leave it "
                        "out, or send the whole conversation with thread type 'create' to change it.", param=name)
            previous = thread.previous_message_id
            with self._lock:
                kept = self._kept.get(previous)
                if kept is None or kept.owner != owner:
                    raise NotFoundError(f"No thread is kept for previous_message_id '{previous}' (threads are kept in "
                                        "memory, the newest first). Send the whole conversation with thread type "
                                        "'create'.", param="thread.previous_message_id", code="thread_not_found")
                if kept.messages is None:
                    raise InvalidRequestError(
                        f"The reply '{previous}' has already been continued; continue from the thread's latest "
                        "reply, or send the whole conversation with thread type 'create'.",
                        param="thread.previous_message_id", code="thread_already_continued")
                self._kept.move_to_end(previous)
                req = req.model_copy(update={"messages": [*kept.messages, *req.messages], "system": kept.system,
                                             "tools": kept.tools})
        return Asked(req, Ticket(self, owner, previous, req))

    def _keep(self, ticket: Ticket, message_id: str, messages: list[InputMessage]) -> None:
        req = ticket.req
        size = len(json.dumps([req.system if isinstance(req.system, str) else _dump(req.system), req.tools,
                               _dump(messages)]))
        with self._lock:
            if ticket.previous is not None and (prev := self._kept.get(ticket.previous)) is not None:
                self._chars -= prev.size
                prev.messages, prev.system, prev.tools, prev.size = None, None, None, 0
            self._kept[message_id] = _Kept(ticket.owner, req.system, req.tools, messages, size)
            self._chars += size
            while self._kept and (len(self._kept) > self.max_threads or self._chars > self.max_chars):
                _, gone = self._kept.popitem(last=False)
                self._chars -= gone.size


def _dump(value: Any) -> Any:
    if isinstance(value, list):
        return [v.model_dump(mode="json", by_alias=True, exclude_none=True) if hasattr(v, "model_dump") else v
                for v in value]
    return value


def with_reply(messages: list[InputMessage], content: list[dict[str, Any]]) -> list[InputMessage]:
    """The conversation followed by the reply. A last assistant turn was a prefill the reply
    continued: they become one turn, its text and the reply's first text joined."""
    reply = InputMessage.model_validate({"role": "assistant", "content": content})
    if not messages or messages[-1].role != "assistant":
        return [*messages, reply]
    last = messages[-1]
    before = [TextBlock(type="text", text=last.content)] if isinstance(last.content, str) else list(last.content or [])
    after = list(reply.content or [])
    if before and after and isinstance(before[-1], TextBlock) and isinstance(after[0], TextBlock):
        before[-1] = TextBlock(type="text", text=before[-1].text + after[0].text)
        after = after[1:]
    return [*messages[:-1], InputMessage(role="assistant", content=[*before, *after])]
