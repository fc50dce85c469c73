"""Whether the store answers, and what to do while it does not (a circuit breaker).

Every call to the store has a deadline (``database_timeout``). One that fails (the database is
stopped, unreachable, or frozen past the deadline) marks the store down: for ``BACKOFF_S`` after,
requests that need the store get the same 503 at once instead of each waiting out its own
deadline, and requests that do not need it never notice. Then one request at a time is let
through to try; the store's heartbeat (store.py) tries every second as well, so the store is
found again by itself, with no request needed. Requests that do not touch the store (chat,
``store: false`` responses, embeddings, speech) are never held by any of this.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..core.errors import ServiceUnavailableError

log = logging.getLogger(__name__)

BACKOFF_S = 2.0   # after a failure, requests are refused at once for this long before one tries again


class StoreUnavailable(ServiceUnavailableError):
    """The database of stored responses cannot be reached or did not answer in time."""

    def __init__(self, message: str):
        super().__init__(message, code="store_unavailable", headers={"Retry-After": "2"})


class StoreHealth:
    """The store's state as its calls found it: up, or down since a time, with the reason."""

    def __init__(self, what: str):
        self.what = what
        self._lock = threading.Lock()
        self.down_since: float | None = None   # time.time() of the first failure in a row
        self.error: StoreUnavailable | None = None
        self._retry_at = 0.0                     # time.monotonic() before which calls are refused

    @property
    def up(self) -> bool:
        return self.down_since is None

    def check(self) -> None:
        """Raises the last failure at once while the store is known to be down, except for one
        caller each ``BACKOFF_S`` (or once the last try's deadline passed), who tries."""
        if self.down_since is None:
            return
        with self._lock:
            error, now = self.error, time.monotonic()
            if error is None or now >= self._retry_at:
                self._retry_at = now + BACKOFF_S   # this caller tries; the others keep failing fast
                return
        raise StoreUnavailable(error.message)

    def failed(self, error: StoreUnavailable) -> None:
        with self._lock:
            first = self.down_since is None
            if first:
                self.down_since = time.time()
            self.error = error
            self._retry_at = time.monotonic() + BACKOFF_S
        if first:
            log.warning("the store of responses is unavailable: %s Requests that need it get a 503 until it answers "
                        "again; the others are served as usual.", error.message)

    def ok(self) -> None:
        if self.down_since is None:
            return
        with self._lock:
            since, self.down_since, self.error = self.down_since, None, None
        if since is not None:
            log.warning("the store of responses answers again (it was unavailable for %.1f s)", time.time() - since)

    def describe(self) -> dict[str, Any]:
        """For /health: up or not, and why."""
        if self.down_since is None:
            return {"ok": True, "store": self.what}
        error = self.error
        return {"ok": False, "store": self.what, "down_since": int(self.down_since),
                "error": error.message if error else "unavailable"}
