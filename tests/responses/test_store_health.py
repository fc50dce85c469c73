"""The store's circuit breaker on its own: after a failure the requests that need the store are
refused at once, one caller is let through to try again after the back-off, and a success closes
it. The clock is the test's own, so nothing depends on the machine's speed."""

from __future__ import annotations

import pytest

from openai_ext.responses import store_health
from openai_ext.responses.store_health import BACKOFF_S, StoreHealth, StoreUnavailable


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(store_health.time, "monotonic", lambda: now[0])
    return now


def test_up_lets_every_call_through(clock):
    health = StoreHealth("db")
    for _ in range(3):
        health.check()
    assert health.up and health.describe() == {"ok": True, "store": "db"}


def test_down_refuses_at_once_then_lets_one_caller_try(clock):
    health = StoreHealth("db")
    health.failed(StoreUnavailable("The database (db) did not answer within 5 s."))
    assert not health.up
    with pytest.raises(StoreUnavailable) as e:
        health.check()
    assert e.value.status == 503 and e.value.code == "store_unavailable" and "did not answer" in e.value.message
    assert e.value.headers["Retry-After"]
    clock[0] += BACKOFF_S
    health.check()   # this caller tries
    with pytest.raises(StoreUnavailable):
        health.check()   # the others still fail fast while it does
    described = health.describe()
    assert described["ok"] is False and "did not answer" in described["error"]
    health.ok()
    health.check()
    assert health.up
