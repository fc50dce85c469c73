"""One response on its way: the prepared ``Turn`` (the chat job that generates it, the state that
becomes the Response object, its MCP servers) and ``Record``, where it goes once over. stream.py
runs a turn; ``settle`` stores its end, once, whatever ends it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio

from ..core.errors import OpenAIError, internal_error
from ..text.generation import Job
from ..text.service import TextService
from . import compaction as compaction_
from . import file_search, mcp, render
from .item_types import Items
from .tools import ToolMap


@dataclass(frozen=True)
class Record:
    """Where a response goes once it is over: who asked for it (only they may see it, on a server
    with several keys), its conversation, the input items it adds there, and whether the response
    itself is stored."""
    owner: str
    conversation: str | None
    input: Items
    store: bool


@dataclass
class Turn:
    """One prepared response: the chat job that generates it, the state that becomes the Response
    object, and what happens to it once it is over (``settle``: storing it)."""
    job: Job
    state: render.ResponseState
    text: TextService                                      # the lane of the model that serves it
    stream: bool = False
    max_tool_calls: int | None = None
    want_logprobs: bool = False
    tools: ToolMap | None = None                           # the way back from the names the model calls
    settle_work: Callable[["Turn"], None] | None = None   # blocking; runs once, on a worker thread
    record: Record | None = None                           # what settle_work stores, and for whom
    compaction: compaction_.Plan | None = None            # a compaction to run before the answer
    answer: bool = True                                    # false: the compaction alone (compaction_trigger)
    rebuild: Callable[[Items], Job] | None = None          # the job again, from the compacted context
    before: Items = field(default_factory=list)            # the items before its input (its chain's)
    servers: mcp.Servers | None = None                     # its MCP servers, when it has mcp tools
    search: file_search.Search | None = None               # its file_search tool, when it has one
    again: Callable[[Items, dict[str, Any]], Job] | None = None   # the next pass's job (mcp)
    compacted: Items | None = None                         # the context once compacted (the compaction item)
    spent: list[int] = field(default_factory=lambda: [0, 0])   # prompt and output tokens of its passes
    tool_choice: Any = None                                # as the request sent it (mcp: the next passes')
    max_output_tokens: int | None = None                   # the whole response's budget, all passes
    _seq: int = 0
    _settling: "asyncio.Future[None] | None" = None   # the store's write of its end, once begun

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, **fields, "sequence_number": self._seq}
        self._seq += 1
        return ev

    def fail(self, err: BaseException) -> None:
        if self.state.done:
            return
        if isinstance(err, (asyncio.CancelledError, GeneratorExit)):
            # The client left (or a background response was cancelled): its generation is stopped.
            self.state.finish("cancelled")
            return
        error = err if isinstance(err, OpenAIError) else internal_error(err)
        code = "rate_limit_exceeded" if error.status == 429 else "server_error"
        self.state.finish("failed", error={"code": code, "message": error.message})

    @property
    def settled(self) -> bool:
        return self._settling is not None

    async def settle(self) -> None:
        """Stores the response as it ended, once, and waits for that, even while being cancelled
        (also by a bare task cancel, which an anyio shield does not hold off: the write goes on
        beside, and a later call waits for it). A store that fails raises its error, the response
        then failed (``settle_work`` sees to that)."""
        if self.settle_work is None:
            return
        if self._settling is None:
            self._settling = _pending(anyio.to_thread.run_sync(self.settle_work, self))
        with anyio.CancelScope(shield=True):
            await asyncio.shield(self._settling)

    def settle_soon(self) -> None:
        """The same, from a callback on the event loop (a stream whose client left before it
        began): the response is cancelled, and stored on a worker thread, never on the loop; a
        store that fails owes it (store.py)."""
        if self._settling is None and self.settle_work is not None:
            self.fail(asyncio.CancelledError())
            self._settling = _pending(anyio.to_thread.run_sync(self.settle_work, self))
            self._settling.add_done_callback(lambda f: f.cancelled() or f.exception())   # (seen: not logged)


_PENDING: set["asyncio.Future[None]"] = set()   # writes under way, kept until done (the loop keeps weak references)


def _pending(work: Any) -> "asyncio.Future[None]":
    future = asyncio.ensure_future(work)
    _PENDING.add(future)
    future.add_done_callback(_PENDING.discard)
    return future
