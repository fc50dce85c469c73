"""Lazy engine loading: one load for many waiters, failures reported to all, then retried."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import pytest

from openai_ext.core.lazy import Lazy


class Loader:
    """Counts its loads; fails while ``failing`` is set; each load takes ``seconds``."""

    def __init__(self, seconds: float = 0.3):
        self.seconds = seconds
        self.calls = 0
        self.failing = False
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            self.calls += 1
        time.sleep(self.seconds)
        if self.failing:
            raise RuntimeError("no such model")
        return object()


def test_many_waiters_share_one_load_and_hold_no_threads():
    loader = Loader()
    lazy = Lazy(loader, "engine")

    async def main():
        before = anyio.to_thread.current_default_thread_limiter().borrowed_tokens
        tasks = [asyncio.ensure_future(lazy.get()) for _ in range(30)]
        await asyncio.sleep(0.1)
        # one worker thread runs the load; the 29 others wait without one
        assert anyio.to_thread.current_default_thread_limiter().borrowed_tokens - before == 1
        values = await asyncio.gather(*tasks)
        return values

    values = asyncio.run(main())
    assert loader.calls == 1 and all(v is values[0] for v in values)
    assert lazy.loaded and lazy.get_blocking() is values[0]


def test_a_failed_load_reaches_every_waiter_once_and_the_next_request_retries():
    loader = Loader()
    loader.failing = True
    lazy = Lazy(loader, "engine")

    async def round_of(n):
        return await asyncio.gather(*(lazy.get() for _ in range(n)), return_exceptions=True)

    results = asyncio.run(round_of(8))
    assert all(isinstance(r, RuntimeError) for r in results)
    assert loader.calls == 1   # one load for the eight, not eight in a row
    assert not lazy.loaded
    loader.failing = False
    assert all(not isinstance(r, Exception) for r in asyncio.run(round_of(3)))
    assert loader.calls == 2 and lazy.loaded


def test_blocking_callers_share_the_load_too():
    loader = Loader()
    lazy = Lazy(loader, "engine")
    out = []
    threads = [threading.Thread(target=lambda: out.append(lazy.get_blocking())) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loader.calls == 1 and len(out) == 5 and all(v is out[0] for v in out)


def test_a_cancelled_request_does_not_abandon_the_load():
    loader = Loader()
    lazy = Lazy(loader, "engine")

    async def main():
        first = asyncio.ensure_future(lazy.get())
        second = asyncio.ensure_future(lazy.get())
        await asyncio.sleep(0.05)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await second

    assert asyncio.run(main()) is not None and loader.calls == 1
