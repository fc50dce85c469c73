"""The one admission primitive: wait in line up to a limit, else a 429 at once."""

from __future__ import annotations

import asyncio

import pytest

from openai_ext.core.admission import Admission
from openai_ext.core.errors import RateLimitError


def test_fifo_and_bounded_and_a_cancelled_waiter_gives_its_place_back():
    async def scenario():
        line = Admission("transcription", max_waiting=2, retry_after=5)
        order = []
        entered = {n: asyncio.Event() for n in "abc"}
        release = asyncio.Event()

        async def job(name):
            async with line.admit():
                order.append(name)
                entered[name].set()
                if name == "a":
                    await release.wait()
        first = asyncio.create_task(job("a"))
        await entered["a"].wait()
        waiting = [asyncio.create_task(job(n)) for n in "bc"]
        while line.waiting < 2:
            await asyncio.sleep(0)
        with pytest.raises(RateLimitError) as e:
            line.admit()
        assert e.value.status == 429 and e.value.headers["Retry-After"] == "5"
        assert "transcription queue is full" in e.value.message
        waiting[0].cancel()                       # a waiter that is cancelled gives its place back
        await asyncio.gather(waiting[0], return_exceptions=True)
        assert line.waiting == 1
        release.set()
        await asyncio.gather(first, waiting[1])
        assert order == ["a", "c"] and line.waiting == 0 and line.running == 0
    asyncio.run(scenario())


def test_a_place_never_used_is_given_back_by_release_and_twice_is_harmless():
    line = Admission("generation", max_waiting=1)
    place = line.admit()
    with pytest.raises(RateLimitError):
        line.admit()
    place.release()
    place.release()
    assert line.waiting == 0 and line.running == 0
    line.admit().release()


def test_capacity_runs_that_many_at_once_in_order_of_arrival():
    async def scenario():
        line = Admission("generation", max_waiting=10, capacity=2)
        running, peak, order = 0, 0, []
        gates = [asyncio.Event() for _ in range(5)]

        async def job(i):
            nonlocal running, peak
            async with line.admit():
                order.append(i)
                running += 1
                peak = max(peak, running)
                await gates[i].wait()
                running -= 1
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(job(i)))
            await asyncio.sleep(0)
        while len(order) < 2:
            await asyncio.sleep(0)
        assert order == [0, 1] and line.running == 2 and line.waiting == 3
        for gate in gates:
            gate.set()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3, 4] and peak == 2
    asyncio.run(scenario())


def test_resize_lets_more_run_or_fewer_start():
    async def scenario():
        line = Admission("generation", max_waiting=10, capacity=1)
        hold = asyncio.Event()
        started = []

        async def job(i):
            async with line.admit():
                started.append(i)
                await hold.wait()
        tasks = [asyncio.create_task(job(i)) for i in range(3)]
        while not started:
            await asyncio.sleep(0)
        line.resize(3)                     # the two waiting ones start at once
        while len(started) < 3:
            await asyncio.sleep(0)
        line.resize(1)                     # shrinking never stops what runs
        assert line.running == 3
        hold.set()
        await asyncio.gather(*tasks)
        assert line.running == 0
        # after shrinking, one at a time again
        gate, order = asyncio.Event(), []

        async def one(i):
            async with line.admit():
                order.append(("in", i))
                await gate.wait()
                order.append(("out", i))
        tasks = [asyncio.create_task(one(i)) for i in range(2)]
        while not order:
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        assert order == [("in", 0)]
        gate.set()
        await asyncio.gather(*tasks)
        assert order == [("in", 0), ("out", 0), ("in", 1), ("out", 1)]
    asyncio.run(scenario())


def test_a_place_set_aside_lets_another_run_and_queues_again_behind_it():
    """place.aside(): while a request waits on a remote call, its slot serves the next in line;
    after, it waits at the back of the line (the limit on waiters does not refuse it); left by an
    exception, the place is given back at once."""
    async def scenario():
        line = Admission("generation", max_waiting=1)
        order = []
        remote = asyncio.Event()

        async def agent():
            async with line.admit() as place:
                order.append("agent: first pass")
                async with place.aside():
                    order.append("agent: calling")
                    await remote.wait()
                order.append("agent: second pass")

        async def chat():
            async with line.admit():
                order.append("chat")
                remote.set()
                await asyncio.sleep(0)

        a = asyncio.create_task(agent())
        while "agent: calling" not in order:
            await asyncio.sleep(0)
        assert line.running == 0
        c = asyncio.create_task(chat())
        await asyncio.gather(a, c)
        assert order == ["agent: first pass", "agent: calling", "chat", "agent: second pass"]
        assert line.running == 0 and line.waiting == 0

        async def leaves():
            async with line.admit() as place:
                async with place.aside():
                    raise asyncio.CancelledError
        with pytest.raises(asyncio.CancelledError):
            await leaves()
        assert line.running == 0 and line.waiting == 0 and line.admit() is not None

    asyncio.run(scenario())
