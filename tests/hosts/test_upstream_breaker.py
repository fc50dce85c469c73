"""The upstream's breaker on its own: it opens after faults in a row, not for a client's mistakes,
and it can never stay open with nobody checking the upstream. Ordered by events."""

from __future__ import annotations

import threading

from support.servers import wait_until

from openai_ext.core.errors import InvalidRequestError, UpstreamError
from openai_ext.hosts.upstream.breaker import THRESHOLD, Breaker


def fault() -> UpstreamError:
    return UpstreamError("The upstream engine at http://gpu:8000 failed (500).", code="upstream_error")


def test_faults_in_a_row_open_it_and_a_client_error_does_not():
    answers = threading.Event()

    def check() -> None:   # the upstream's model list: down until ``answers`` is set
        if not answers.is_set():
            raise fault()

    breaker = Breaker("http://gpu:8000", check=check)
    for _ in range(THRESHOLD + 2):
        breaker.failed(InvalidRequestError("bad request"))
    assert breaker.refusal() is None and breaker.failures == 0
    for _ in range(THRESHOLD):
        breaker.failed(fault())
    refusal = breaker.refusal()
    assert refusal is not None and refusal.status == 503 and refusal.code == "upstream_unavailable"
    answers.set()
    wait_until(lambda: breaker.refusal() is None, "the breaker closes once the upstream answers", tries=600)
    breaker.close()


def test_a_fault_just_as_the_checks_end_still_gets_the_upstream_checked():
    """A check thread that has just closed the breaker is ending when a request's fault opens it
    again: it starts no new check then. The next refusal does, so the breaker cannot stay open
    with nobody checking."""
    breaker = Breaker("http://gpu:8000", check=lambda: None)
    assert breaker._checking.acquire(blocking=False)   # the ending check thread still holds it
    breaker.failures = THRESHOLD - 1                      # half open, as a check leaves it
    breaker.failed(fault())                               # opens again; check_soon finds a check running
    assert breaker.refusal() is not None
    breaker._checking.release()                           # that thread ends
    breaker.refusal()                                     # a request refused while it is open
    wait_until(lambda: breaker.refusal() is None, "a check runs and finds the upstream answering", tries=600)
    breaker.close()
