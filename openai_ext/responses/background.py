"""Background responses (``background: true``): the request is answered at once with status
``queued``, and the response runs in line like any other, after the request has returned.

Each run keeps its events in memory while it runs, so ``GET /v1/responses/{id}`` shows its live
state, a ``stream: true`` request (or ``GET ...?stream=true&starting_after=N``) follows it from any
point, and ``POST /v1/responses/{id}/cancel`` stops it: cancelling the task leaves ``run_job``,
which stops the host within a token, as a client that leaves a stream does. When a run ends, its
events are stored, so a stream can still replay it later (after a restart too).

Several servers may share one store (database_url): a run lives on the server that took the
request, which writes its status to the store as it starts (``queued`` to ``in_progress``), so
any server shows it. Another server's cancel (or delete) reaches it through the store: while runs
are live here, ``_watch`` asks the store every ``POLL_S`` which of them must stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio

from ..core.admission import Place
from ..core.errors import OpenAIError, ServiceUnavailableError
from ..text.service import TextService
from . import framing, stream
from .render import TERMINAL
from .store import Store
from .turn import Turn

log = logging.getLogger(__name__)

POLL_S = 0.25          # how often the store is asked whether another server cancelled a run of this one
CANCEL_WAIT_S = 10.0   # how long a cancel waits for the server that runs the response to stop it


class Run:
    """One background response while it runs: its turn, its task and its events so far."""

    def __init__(self, turn: Turn, place: Place):
        self.turn = turn
        self.place = place
        self.log: list[dict[str, Any]] = []
        self.done = False
        self.task: asyncio.Task[None] | None = None
        self.noted: asyncio.Future[None] | None = None   # the store told that it runs
        self._changed = asyncio.Event()

    def append(self, event: dict[str, Any]) -> None:
        self.log.append(event)
        self._changed.set()

    def close(self) -> None:
        self.done = True
        self._changed.set()

    def snapshot(self) -> dict[str, Any]:
        """The response as a GET shows it: still in progress until its end is stored (the final
        event is sent only then), so that no client continues from an end the store lacks."""
        body = self.turn.state.snapshot()
        if body["status"] in TERMINAL and not self.done:
            body.update(status="in_progress", completed_at=None, error=None, incomplete_details=None)
        return body

    async def follow(self, after: int = -1) -> AsyncGenerator[dict[str, Any], None]:
        """Its events with a sequence_number above ``after``, then the rest as they come."""
        i = next((k for k, e in enumerate(self.log) if e["sequence_number"] > after), len(self.log))
        while True:
            while i < len(self.log):
                yield self.log[i]
                i += 1
            if self.done:
                return
            self._changed.clear()
            if i < len(self.log) or self.done:
                continue
            await self._changed.wait()


class Background:
    def __init__(self, text: TextService, store: Store):
        self.text = text
        self.store = store
        self.runs: dict[str, Run] = {}
        self._watcher: asyncio.Task[None] | None = None

    def start(self, turn: Turn, place: Place) -> Run:
        """Runs ``turn`` in the background; ``place`` is its place in line, already admitted."""
        run = Run(turn, place)
        self.runs[turn.state.id] = run
        run.task = asyncio.get_running_loop().create_task(self._drive(run))
        # A task cancelled before it ever ran skips its own cleanup: this one always runs.
        run.task.add_done_callback(lambda _: self._cleanup(run))
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return run

    async def _watch(self) -> None:
        """Stops the runs that another server cancelled or deleted (through the store), for as
        long as runs are live here."""
        while self.runs:
            await asyncio.sleep(POLL_S)
            try:
                stop = await anyio.to_thread.run_sync(self.store.stopping, list(self.runs))
            except Exception as e:  # noqa: BLE001 - the store may come back; the runs go on meanwhile
                # (the store's health logs its outage once; this would say it four times a second)
                log.debug("cannot ask the store whether background responses were cancelled (%s)", e)
                continue
            for response_id in stop:
                run = self.runs.get(response_id)
                if run is not None and run.task is not None:
                    log.info("background response %s cancelled through the store", response_id)
                    run.task.cancel()

    async def _drive(self, run: Run) -> None:
        turn = run.turn
        try:
            events = stream.events(turn.text, turn, run.place)
            async with contextlib.aclosing(events):
                async for event in events:
                    run.append(event)
                    if event["type"] == "response.in_progress":
                        # told to the store beside the run, not before it goes on: a slow store must
                        # not hold the generation's turn. The body is the event's (in progress),
                        # and the store writes it only over "queued", never over a later end.
                        run.noted = asyncio.ensure_future(anyio.to_thread.run_sync(
                            self._progress, run.turn.state.id, event["response"]))
        except asyncio.CancelledError:
            pass   # POST /cancel (or shutdown): the response is stored as cancelled
        except Exception as e:  # noqa: BLE001 - the response is stored as failed, with its error
            if isinstance(e, OpenAIError):
                log.warning("background response %s failed: %s", turn.state.id, e.message)
            else:
                log.exception("background response %s failed", turn.state.id)
            for event in framing.failure_events(turn, e if isinstance(e, OpenAIError) else None, e):
                run.append(event)
        finally:
            run.place.release()
            run.close()
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(OpenAIError):   # its end is owed to the store (store.py)
                    await turn.settle()
                await anyio.to_thread.run_sync(self._keep_events, run)

    def _progress(self, response_id: str, body: dict[str, Any]) -> None:
        try:
            self.store.progress(body)
        except Exception as e:  # noqa: BLE001 - the run goes on; only other servers see it queued
            log.warning("cannot store that background response %s is in progress (%s)", response_id, e)

    def _keep_events(self, run: Run) -> None:
        try:
            self.store.put_events(run.turn.state.id, run.log)
        except RuntimeError:
            pass   # the server is shutting down
        except Exception as e:  # noqa: BLE001 - the response itself is stored (or not) by settle
            log.warning("the events of background response %s are not kept (%s)", run.turn.state.id, e)

    def _cleanup(self, run: Run) -> None:
        run.place.release()
        run.close()
        if not run.turn.settled:
            run.turn.settle_soon()
        self.runs.pop(run.turn.state.id, None)

    def get(self, response_id: str) -> Run | None:
        return self.runs.get(response_id)

    async def cancel(self, response_id: str) -> dict[str, Any] | None:
        """Stops a running background response; its Response object once stopped (None: it does
        not run here)."""
        run = self.runs.get(response_id)
        if run is None or run.task is None:
            return None
        run.task.cancel()
        await asyncio.wait({run.task})
        return run.turn.state.snapshot()

    async def cancel_elsewhere(self, response_id: str, who: str | None) -> dict[str, Any] | None:
        """Cancels a background response that another server sharing the store runs: that server is
        asked through the store, and its answer awaited ``CANCEL_WAIT_S`` at most. The response
        as it ended (None: there is no such response)."""
        await anyio.to_thread.run_sync(self.store.request_cancel, response_id, who)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            body = await anyio.to_thread.run_sync(self.store.response, response_id, who)
            if body is None or body["status"] not in ("queued", "in_progress"):
                return body
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(f"Response '{response_id}' runs on another server sharing this store, "
                                              f"which was asked to cancel it but did not within {CANCEL_WAIT_S:g} s. "
                                              "Retrieve it later, or cancel it again.")
            await anyio.sleep(0.1)

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        for run in list(self.runs.values()):
            if run.task is not None:
                run.task.cancel()
