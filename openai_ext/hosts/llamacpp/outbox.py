"""A generation's outbox: what the scheduler's thread produces for one reader, handed on without
the scheduler ever waiting.

The reader is either a thread that blocks (``get``: the Host's ``generate``) or the event loop
itself (``aget``: the Host's ``stream``). The event loop is woken only when it waits for this
outbox, so a reader that keeps up costs one wake-up a piece and one that is behind costs none.
No thread sits between the scheduler and the client: at one stream on two cores llama.cpp's
threads keep both cores busy, and every other thread that runs takes from them (one stream gave
1.05x the tokens/s of reading through a worker thread, ten rounds taking turns).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, AsyncGenerator, Callable, Iterator, Protocol

import anyio

from ..base import Piece

# Pieces a generation may produce ahead of its reader: while its reader is behind (a slow
# client), the sequence sits out steps instead of running ahead.
OUTBOX = 16


class _End:
    """The generation is over (after its last piece, or stopped without one)."""


END = _End()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():   # (its reader may have been cancelled meanwhile)
        waiter.set_result(None)


class Outbox:
    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._lock = threading.Lock()
        self._filled = threading.Condition(self._lock)
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def qsize(self) -> int:
        """Pieces not read yet."""
        return len(self._items)

    def put(self, item: Any) -> None:
        """Hands ``item`` on (the scheduler's thread); never waits."""
        with self._lock:
            self._items.append(item)
            self._filled.notify()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, future = waiter
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:   # its loop is closed: no one is there to read
                pass

    def get(self) -> Any:
        """The next item, waiting for it (a reader thread)."""
        with self._lock:
            while not self._items:
                self._filled.wait()
            return self._items.popleft()

    async def aget(self) -> Any:
        """The next item, waiting for it in the event loop (one reader at a time)."""
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._waiter = (loop, future)
            await future


class Reader(Protocol):
    """What a reader needs of a generation (llamacpp/work.py)."""
    out: Outbox
    stop_event: threading.Event

    def cancel(self) -> None: ...


def pieces(work: Reader, wake: Callable[[], None]) -> Iterator[Piece]:
    """``work``'s pieces, read on this thread. Leaving the iteration ends the sequence and returns
    once it has left the batch (its slot is free and its samplers are gone)."""
    item: Any = None
    try:
        while True:
            item = work.out.get()
            if _handled(work, item, wake):
                return
            yield item
    finally:
        work.cancel()
        wake()
        while item is not END:
            item = work.out.get()


async def apieces(start: Callable[[], Reader], wake: Callable[[], None]) -> AsyncGenerator[Piece, None]:
    """The pieces of the generation ``start()`` submits, read in the event loop; as ``pieces``."""
    # Building its samplers may compile a grammar or read images: on a worker thread. Shielded:
    # a generation submitted must be read to its end, or its sequence would stay in the batch.
    with anyio.CancelScope(shield=True):
        work = await anyio.to_thread.run_sync(start)
    item: Any = None
    try:
        while True:
            item = await work.out.aget()
            if _handled(work, item, wake):
                return
            yield item
    finally:
        work.cancel()
        wake()
        with anyio.CancelScope(shield=True):
            while item is not END:
                item = await work.out.aget()


def _handled(work: Reader, item: Any, wake: Callable[[], None]) -> bool:
    """True when ``item`` ends the reading; raises the failure it carries."""
    if work.out.qsize() == OUTBOX - 1:   # it was held back for this reader: on it goes
        wake()
    if isinstance(item, BaseException):
        raise item
    return item is END or work.stop_event.is_set()
