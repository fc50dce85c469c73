"""The server's shutdown as its open streams see it.

On SIGTERM or Ctrl-C (standalone) or ApiServer.stop() (the web UI's shutdown, tests), uvicorn
stops accepting connections and waits up to the shutdown_grace_s setting for the open ones to
finish before it cancels them. A stream would run to its end or be cut dead; instead each open
stream is told at once (``Drain.start``), stops its work and ends with an error event and its
family's end marker, so its client learns why and may retry elsewhere. Short plain requests
finish within the grace period.
"""

from __future__ import annotations

import asyncio
import threading


class Drain:
    def __init__(self, grace: float = 5.0) -> None:
        self.draining = False
        # The server's shutdown_grace_s: a stream stops its work (a step of a large model on a
        # CPU may take seconds) and sends its closing event within it.
        self.grace = grace
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def event(self) -> asyncio.Event:
        """The event a stream waits on, for the running loop (the server has one)."""
        with self._lock:
            if self._event is None:
                self._loop = asyncio.get_running_loop()
                self._event = asyncio.Event()
                if self.draining:
                    self._event.set()
            return self._event

    def start(self) -> None:
        """Tells every open stream to end; callable from any thread or a signal handler."""
        with self._lock:
            self.draining = True
            loop, event = self._loop, self._event
        if loop is not None and event is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass  # the loop has just closed: nothing is open any more
