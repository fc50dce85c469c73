"""Deadlines for blocking calls into a dependency (a database), enforced by this server.

A server-side timeout (PostgreSQL's ``statement_timeout``) or a TCP keepalive cannot stop a call
to a database whose process is frozen: the kernel still acknowledges every packet, and nothing
ever answers. The one deadline that always holds is the caller's own: the call is armed with an
``abort`` that breaks it from another thread (shutting its socket down, interrupting SQLite), and
one watchdog thread runs the aborts of the calls whose deadline passed. A call that ended first
disarms its deadline, so an abort never reaches a connection that went back to its pool.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class Armed:
    """One armed deadline. ``disarm()`` says whether the call ended in time (the abort did not run
    and now never will); ``fired`` says whether it ran."""

    __slots__ = ("_abort", "_lock", "fired", "_done")

    def __init__(self, abort: Callable[[], None]):
        self._abort = abort
        self._lock = threading.Lock()
        self.fired = False
        self._done = False

    def disarm(self) -> bool:
        with self._lock:
            self._done = True
            return not self.fired

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            try:
                self._abort()
            except Exception as e:  # noqa: BLE001 - an abort that fails leaves the call to its own end
                log.debug("aborting a call past its deadline failed: %s", e)


class Watchdog:
    """One daemon thread that aborts calls past their deadline (started on first use)."""

    def __init__(self, name: str):
        self.name = name
        self._heap: list[tuple[float, int, Armed]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, abort: Callable[[], None]) -> Armed:
        """Runs ``abort()`` at ``deadline`` (time.monotonic()) unless disarmed first."""
        armed = Armed(abort)
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._order), armed))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return armed

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    # calls that ended are dropped as they come up, without waiting for their time
                    while self._heap and self._heap[0][2]._done:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        armed = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(wait)
            armed._fire()


# One for the process: every database shares it (its thread starts on first use).
WATCHDOG = Watchdog("deadlines")
