"""The upstream's health as this server last saw it: a circuit breaker, and checks in the background.

After ``THRESHOLD`` faults of the upstream in a row (it could not be reached, it timed out, it
answered 5xx, it broke a stream) the breaker opens: every request is refused at once with a 503,
before it takes a place in line, instead of each waiting for a fault of its own. A client's own
mistake (the upstream's 4xx) and a client that leaves are not the upstream's faults and count for
nothing. While it is open, the upstream is checked every ``INTERVAL`` seconds (its model list, with
short timeouts, on a thread of its own); once it answers, requests go through again, and the next
fault opens the breaker again at once (half open) until a generation has succeeded.

``readiness()`` answers from what was last seen, never waiting; asked again after ``STALE``
seconds it has the upstream checked in the background, so a load balancer's health checks find an
idle server's upstream down within a couple of seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ...core.errors import OpenAIError, ServiceUnavailableError

log = logging.getLogger(__name__)

THRESHOLD = 3      # faults in a row that open the breaker
INTERVAL = 1.0     # seconds between checks while it is open
STALE = 1.0        # seconds after which a readiness answer has the upstream checked again

# Errors of the upstream that are a setting of this server to fix, not the upstream being down.
NOT_FAULTS = frozenset({"upstream_auth", "upstream_model_not_found"})


def is_fault(error: OpenAIError) -> bool:
    """Whether an error the upstream caused says it cannot serve (rather than a client's mistake,
    passed on as a 4xx, or a setting to fix)."""
    return error.status >= 500 and error.code not in NOT_FAULTS


class Breaker:
    def __init__(self, shown: str, check: Callable[[], None]):
        """``check()``: asks the upstream whether it answers, raising the OpenAIError it got if not."""
        self.shown = shown
        self.check = check
        self._lock = threading.Lock()
        self.failures = 0                          # upstream faults in a row
        self.last: OpenAIError | None = None       # the latest of them
        self.opened: float | None = None           # when the breaker opened (monotonic); None: closed
        self.checked: float | None = None          # when the latest check ended
        self.check_error: OpenAIError | None = None  # what the latest check got; None: it answered
        self._checking = threading.Lock()          # held by the one checking thread
        self._closed = threading.Event()

    # what requests report ---------------------------------------------------------------------
    def failed(self, error: OpenAIError) -> None:
        if not is_fault(error):
            return
        with self._lock:
            self.failures += 1
            self.last = error
            opening = self.opened is None and self.failures >= THRESHOLD
            if opening:
                self.opened = time.monotonic()
        if opening:
            log.warning("the upstream engine at %s failed %d times in a row (%s); requests are refused until it "
                        "answers again", self.shown, self.failures, error.message)
            self.check_soon()

    def succeeded(self) -> None:
        with self._lock:
            self.failures, self.last, self.opened = 0, None, None

    def refusal(self) -> OpenAIError | None:
        """The 503 to refuse a request with while the breaker is open; None while it is closed."""
        with self._lock:
            if self.opened is None:
                return None
            failures, last = self.failures, self.last
        # A check thread that was just ending as a fault opened the breaker again started none:
        # while it is open, every refusal makes sure one runs (a no-op while one does).
        self.check_soon()
        why = f" (the latest: {last.message})" if last is not None else ""
        return ServiceUnavailableError(
            f"The upstream engine at {self.shown} failed {failures} times in a row{why}. Requests are refused at "
            f"once until it answers again (it is checked every {INTERVAL:g} s).",
            code="upstream_unavailable", headers={"Retry-After": "2"})

    # checks --------------------------------------------------------------------------------------
    def check_once(self) -> None:
        """Checks the upstream now, on the calling thread."""
        try:
            self.check()
        except OpenAIError as e:
            self.failed(e)
            with self._lock:
                self.checked, self.check_error = time.monotonic(), e
            return
        with self._lock:
            self.checked, self.check_error = time.monotonic(), None
            if self.opened is not None:
                # Half open: requests go through again; the next fault opens it at once.
                self.opened = None
                self.failures = THRESHOLD - 1
                log.info("the upstream engine at %s answers again", self.shown)

    def check_soon(self) -> None:
        """Has the upstream checked on a thread of its own, unless a check is under way; while the
        breaker is open, that thread checks again every INTERVAL until it closes."""
        if self._closed.is_set() or not self._checking.acquire(blocking=False):
            return
        try:
            threading.Thread(target=self._checks, name="upstream-check", daemon=True).start()
        except BaseException:
            self._checking.release()
            raise

    def _checks(self) -> None:
        try:
            while not self._closed.is_set():
                self.check_once()
                if self.opened is None or self._closed.wait(INTERVAL):
                    return
        finally:
            self._checking.release()

    def state(self) -> dict[str, Any]:
        """What was last seen, never waiting; has it seen again in the background when it is stale."""
        with self._lock:
            stale = self.checked is None or time.monotonic() - self.checked > STALE
            opened, error, failures, checked = self.opened, self.check_error, self.failures, self.checked
        if stale:
            self.check_soon()
        refusal = self.refusal() if opened is not None else None
        problem = refusal or error
        return {"ready": problem is None, "error": problem.message if problem is not None else None,
                "breaker": "closed" if opened is None else "open", "failures": failures,
                "checked_ago": None if checked is None else round(time.monotonic() - checked, 3)}

    def close(self) -> None:
        self._closed.set()
