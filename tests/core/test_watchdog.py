"""The watchdog that enforces deadlines on blocking calls: an abort runs once its deadline passes,
never after its call was disarmed, and the calls' deadlines are kept in order whatever order they
were armed in. Ordered by events, never by durations."""

from __future__ import annotations

import threading
import time

from openai_ext.core.watchdog import Watchdog


def test_an_abort_runs_past_its_deadline_and_only_then():
    dog = Watchdog("test-deadlines")
    aborted = threading.Event()
    armed = dog.arm(time.monotonic() + 0.05, aborted.set)
    assert aborted.wait(30)
    assert armed.fired and not armed.disarm()   # too late: the caller learns its call was aborted


def test_a_disarmed_call_is_never_aborted():
    dog = Watchdog("test-deadlines")
    ran: list[str] = []
    later = threading.Event()
    early = dog.arm(time.monotonic() + 0.05, lambda: ran.append("early"))
    assert early.disarm()   # ended in time
    dog.arm(time.monotonic() + 0.1, later.set)   # its deadline comes after the disarmed one's
    assert later.wait(30)
    assert ran == [] and not early.fired


def test_deadlines_fire_in_their_order_not_the_order_they_were_armed_in():
    dog = Watchdog("test-deadlines")
    order: list[int] = []
    done = threading.Event()
    now = time.monotonic()
    dog.arm(now + 0.3, lambda: (order.append(3), done.set()))
    dog.arm(now + 0.1, lambda: order.append(1))
    dog.arm(now + 0.2, lambda: order.append(2))
    assert done.wait(30)
    assert order == [1, 2, 3]


def test_an_abort_that_fails_leaves_the_watchdog_running():
    dog = Watchdog("test-deadlines")
    after = threading.Event()

    def broken() -> None:
        raise OSError("the socket was already closed")

    dog.arm(time.monotonic(), broken)
    dog.arm(time.monotonic() + 0.05, after.set)
    assert after.wait(30)
