"""Engines behind the non-chat endpoints (embeddings, speech, transcription), each behind a small
contract, loaded lazily on first use.

``Lazy`` loads an engine once, on a worker thread, even when many requests ask for it at the same
moment: they all wait for that one load (without holding a worker thread each), and a failed load
is reported to all of them. The next request after a failure tries again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Callable, Generic, TypeVar

import anyio

T = TypeVar("T")


class Lazy(Generic[T]):
    def __init__(self, load: Callable[[], T], name: str):
        self._load = load
        self.name = name
        self._value: T | None = None
        self._loading: concurrent.futures.Future | None = None   # the load in progress
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def _join(self) -> tuple[concurrent.futures.Future, bool]:
        """The load in progress (or a finished one), and whether the caller must run it."""
        with self._lock:
            if self._value is not None:
                done: concurrent.futures.Future = concurrent.futures.Future()
                done.set_result(self._value)
                return done, False
            if self._loading is not None:
                return self._loading, False
            self._loading = concurrent.futures.Future()
            # Marked running, so it can no longer be cancelled: asyncio.wrap_future cancels the
            # future it wraps when its waiter is cancelled (a client that leaves), which would
            # fail the load for every other waiter and make the loader's set_result raise.
            self._loading.set_running_or_notify_cancel()
            return self._loading, True

    def _run(self, future: concurrent.futures.Future) -> None:
        try:
            value = self._load()
        except BaseException as e:  # noqa: BLE001 - every waiter hears of it
            with self._lock:
                self._loading = None
            future.set_exception(e)
            return
        with self._lock:
            self._value, self._loading = value, None
        future.set_result(value)

    def get_blocking(self) -> T:
        """For worker threads (never the event loop)."""
        if self._value is not None:
            return self._value
        future, mine = self._join()
        if mine:
            self._run(future)
        return future.result()

    def close(self) -> None:
        """Closes the value, if it was loaded and can be closed; a later get() loads it again."""
        with self._lock:
            value, self._value = self._value, None
        close = getattr(value, "close", None)
        if callable(close):
            close()

    async def get(self) -> T:
        """The engine, loading it on a worker thread the first time (the event loop keeps serving)."""
        if self._value is not None:
            return self._value
        future, mine = self._join()
        if mine:
            # Not cancellable: a request that goes away does not abandon a load others wait for.
            await anyio.to_thread.run_sync(self._run, future)
        return await asyncio.wrap_future(future)
