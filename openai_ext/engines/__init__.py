"""Engines behind the non-chat endpoints (embeddings, speech, transcription), each behind a small
contract, loaded lazily on first use.

``Lazy`` loads an engine once, on a worker thread, even when many requests ask for it at the same
moment; a failed load is reported to every waiting request and retried by the next one.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

import anyio

T = TypeVar("T")


class Lazy(Generic[T]):
    def __init__(self, load: Callable[[], T], name: str):
        self._load = load
        self.name = name
        self._value: T | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def get_blocking(self) -> T:
        if self._value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._load()
        return self._value

    async def get(self) -> T:
        """The engine, loading it on a worker thread the first time (the event loop keeps serving)."""
        if self._value is not None:
            return self._value
        return await anyio.to_thread.run_sync(self.get_blocking)
