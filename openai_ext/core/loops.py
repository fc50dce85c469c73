"""A family's background loop on the server's event loop (the batch runner, vector store
ingestion): started with the app, woken when work arrives, polled otherwise, stopped with the
app; an end that was not a stop is logged, since the work it does would then wait for no one."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Coroutine

import anyio

log = logging.getLogger(__name__)


class Loop:
    def __init__(self, name: str, stranded: str):
        self.name = name            # the task's name, and the log's
        self.stranded = stranded    # what waits if it ends ("batches wait until the server restarts")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._task = asyncio.get_running_loop().create_task(run(), name=self.name)
        self._task.add_done_callback(self._ended)

    def wake(self) -> None:
        self._wake.set()

    async def idle(self, seconds: float) -> None:
        """Waits for ``wake`` or ``seconds``, whichever comes first."""
        with anyio.move_on_after(seconds):
            await self._wake.wait()
        self._wake.clear()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with anyio.CancelScope(shield=True):
                try:
                    await self._task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping: logged where it failed
                    pass

    def _ended(self, task: "asyncio.Task[None]") -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s stopped: %r; %s", self.name, task.exception(), self.stranded)
