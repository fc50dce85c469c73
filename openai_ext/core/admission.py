"""Admission: wait in line up to a limit, else a 429 at once.

Every family whose work queues (text generation, speech, transcription) admits its requests
through one ``Admission``: ``capacity`` requests run at once, up to ``max_waiting`` more wait in
first-come-first-served order, and one more is refused with a 429 and ``Retry-After`` before any
work is done for it.

A request takes its ``Place`` as soon as it arrives (so a full line is told at once), then waits
for its turn with ``async with place``. Every place is given back explicitly (leaving the
``async with``, or ``release()`` for a place never used); nothing depends on the garbage
collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import AsyncIterator

from .errors import RateLimitError


class Place:
    """One request's place in line: waiting, then running, then given back."""

    __slots__ = ("_line", "_state")

    def __init__(self, line: "Admission"):
        self._line = line
        self._state = "waiting"

    @property
    def running(self) -> bool:
        return self._state == "running"

    async def turn(self) -> None:
        """Waits for this place's turn. Cancelled while waiting, the place is given back."""
        if self._state != "waiting":
            raise RuntimeError("a place in line is used once")
        try:
            await self._line._acquire()
        except BaseException:
            self.release()
            raise
        self._state = "running"
        self._line.waiting -= 1
        self._line.running += 1

    async def __aenter__(self) -> "Place":
        await self.turn()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    @contextlib.asynccontextmanager
    async def aside(self) -> AsyncIterator[None]:
        """Steps out of a running turn while the request waits on something other than the model
        (a remote tool's call), so the slot serves others meanwhile, then waits for a turn again,
        at the back of the line (it is no newcomer: the line's limit does not refuse it). Left by an
        exception (the client gone), the place is given back without waiting."""
        if self._state != "running":
            yield
            return
        self._state = "aside"
        self._line.running -= 1
        self._line._pass_on()
        try:
            yield
        except BaseException:
            self._state = "done"
            self._line._gone()
            raise
        self._state = "waiting"
        self._line.waiting += 1
        await self.turn()

    def release(self) -> None:
        """Gives the place back; safe to call more than once, and before the turn came."""
        if self._state == "waiting":
            self._line.waiting -= 1
        elif self._state == "running":
            self._line.running -= 1
            self._line._pass_on()
        if self._state != "done":
            self._line._gone()
        self._state = "done"


class Admission:
    """At most ``capacity`` running and ``max_waiting`` waiting; the next one gets a 429.

    ``what`` names the line in the 429's message ("generation", "speech" ...)."""

    def __init__(self, what: str, *, max_waiting: int, capacity: int = 1, retry_after: int = 1):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.what = what
        self.max_waiting = max_waiting
        self.capacity = capacity
        self.retry_after = retry_after
        self.waiting = 0
        self.running = 0
        self.held = 0                          # places not given back: waiting, running or set aside
        self.last_active = time.monotonic()    # when a place was last given back
        self._free = capacity
        self._turns: deque[asyncio.Future[None]] = deque()

    def admit(self) -> Place:
        """A place in line, or a 429 right away when the line is full."""
        if self.waiting >= self.max_waiting:
            raise RateLimitError(
                f"The {self.what} queue is full ({self.max_waiting} requests waiting). Retry shortly, or raise "
                "the max_queue setting.", code="queue_full", headers={"Retry-After": str(self.retry_after)})
        self.waiting += 1
        self.held += 1
        return Place(self)

    def _gone(self) -> None:
        self.held -= 1
        self.last_active = time.monotonic()

    def resize(self, capacity: int) -> None:
        """Runs up to ``capacity`` at once from now on (a host with more or fewer slots)."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._free += capacity - self.capacity
        self.capacity = capacity
        while self._free > 0 and self._wake_next():
            self._free -= 1

    async def _acquire(self) -> None:
        if self._free > 0 and not self._turns:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._pass_on()   # the turn came together with the cancellation: hand it on
            else:
                self._turns.remove(turn)
            raise

    def _wake_next(self) -> bool:
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():
                turn.set_result(None)
                return True
        return False

    def _pass_on(self) -> None:
        if self._free < 0:       # shrunk below what runs: this turn is not handed on
            self._free += 1
        elif not self._wake_next():
            self._free += 1
