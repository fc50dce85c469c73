"""Several models by name (standalone): a catalog, the models loaded from it, each a lane of its
own, a memory budget and an idle unload, as Ollama keeps models.

- The **catalog** is the ``models_dir`` folder's GGUF files and the ``models`` setting (names for
  paths or hub references). ``/v1/models`` lists it with the model served by default.
- A request that names a catalog model gets that model's **lane**: a ``TextService`` of its own
  (its host, its line of requests sized to its slots, its threads), loaded on first use. A name
  that is not in the catalog goes to the default model, so apps that send ``gpt-4o`` still work.
- Loading runs on a thread of its own: requests for models already loaded go on meanwhile, and
  requests for the model being loaded wait for that one load (counted against ``max_queue``).
- **Budget:** the loaded models' files may take at most ``models_memory_mb`` (and at most
  ``max_loaded_models`` models); to load one more, the least recently used idle models are
  unloaded first. A model that cannot fit while the others are busy waits for one to go idle.
- **keep_alive:** a catalog model idle for its keep_alive (``keep_alive`` setting, or the last
  request's own ``keep_alive``, as Ollama takes it) is unloaded. The default model stays.

A model is idle when no request holds a place in its line and none picked it in the last
``PICK_GRACE`` seconds for keep_alive, ``ROOM_GRACE`` for the budget (a request picks its lane just
before it queues). An unload goes through the model-change path, so nothing runs on a closed model."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..core.catalog import card
from ..core.config import Settings
from ..core.errors import InvalidRequestError, RateLimitError, ServiceUnavailableError
from ..hosts.base import Host
from ..hosts.manager import NoModel
from .service import TextService

log = logging.getLogger(__name__)

PICK_GRACE = 5.0    # seconds a picked lane is not unloaded for being idle before its request queues
# ... and for room: a request that picked a lane takes its place in line without waiting (chat,
# Messages, Responses, Realtime), so only a token count may be caught, and it is told to send again
ROOM_GRACE = 0.2
REAP_EVERY = 1.0    # seconds between idle checks
FOREVER = float("inf")


@dataclass
class Entry:
    """One model of the catalog: its id and where its file is (fetched already, for a hub reference)."""
    id: str
    path: Path
    source: str                    # as the user gave it (a path, a hub reference, a file of models_dir)
    mmproj: Path | None = None

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in (self.path, self.mmproj) if p is not None and p.exists())


@dataclass
class Lane:
    entry: Entry
    text: TextService
    keep_alive: float
    picked: float = field(default_factory=time.monotonic)

    def idle_for(self, now: float) -> float:
        queue = self.text.queue
        if queue.held:
            return 0.0
        return now - max(self.picked, queue.last_active)


def keep_alive_seconds(value: float | int | str | None, default: float) -> float:
    """Ollama's keep_alive: seconds as a number, or a duration ("30s", "5m", "1h", "1h30m");
    negative keeps the model loaded for good, 0 unloads it as soon as it is idle."""
    if value is None:
        seconds = float(default)
    elif isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = re.fullmatch(r"(-)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text)
            if not text or parts is None or not any(parts.groups()[1:]):
                raise InvalidRequestError(f"keep_alive {value!r} is not a duration: give seconds (300), or '30s', "
                                          "'5m', '1h'; negative keeps the model loaded, 0 unloads it when idle.",
                                          param="keep_alive") from None
            sign, h, m, s = parts.groups()
            seconds = (float(h or 0) * 3600 + float(m or 0) * 60 + float(s or 0)) * (-1 if sign else 1)
    return FOREVER if seconds < 0 else seconds


class Lanes:
    """The catalog and its loaded models, beside the default model's own ``TextService``."""

    def __init__(self, settings: Settings, default: TextService, entries: list[Entry],
                 make_host: Callable[[Entry], Host], *, grace: float = PICK_GRACE):
        self.settings = settings
        self.grace = grace
        self.default = default
        self.entries = {e.id: e for e in entries}
        self.make_host = make_host
        self.loaded: dict[str, Lane] = {}
        self._loading: dict[str, asyncio.Future[Lane]] = {}
        self._waiting = 0
        self._reaper: asyncio.Task[None] | None = None
        self._one_load: asyncio.Lock | None = None   # loads one at a time (made in the event loop)
        self._closed = False

    # --- which lane ---------------------------------------------------------------------------

    def find(self, model: str | None) -> Entry | None:
        if not model:
            return None
        name = model.removesuffix(".gguf")
        if name == self.default.host.model_id:
            return None
        return self.entries.get(name)

    async def lane(self, model: str | None, keep_alive: float | int | str | None = None) -> TextService:
        """The service that serves ``model``: its own lane when the catalog has it (loaded first,
        if need be), the default model's otherwise."""
        entry = self.find(model)
        if entry is None:
            return self.default
        seconds = keep_alive_seconds(keep_alive, self.settings.keep_alive)
        lane = self.loaded.get(entry.id)
        if lane is None:
            lane = await self._load(entry)
        lane.picked = time.monotonic()
        lane.keep_alive = seconds   # the last request's keep_alive (or the default) wins, as in Ollama
        return lane.text

    # --- loading ------------------------------------------------------------------------------

    async def _load(self, entry: Entry) -> Lane:
        if self._waiting >= self.settings.max_queue:
            raise RateLimitError(f"{self._waiting} requests wait for models to load. Retry shortly, or raise the "
                                 "max_queue setting.", code="queue_full", headers={"Retry-After": "1"})
        pending = self._loading.get(entry.id)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._loading[entry.id] = pending
            task = asyncio.ensure_future(self._load_now(entry, pending))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._waiting += 1
        try:
            return await asyncio.shield(pending)
        finally:
            self._waiting -= 1

    async def _load_now(self, entry: Entry, done: asyncio.Future[Lane]) -> None:
        if self._one_load is None:
            self._one_load = asyncio.Lock()
        try:
            # One load at a time: two loads that each found room would otherwise take it twice.
            async with self._one_load:
                await self._make_room(entry)
                log.info("Loading %s (%s)", entry.id, entry.source)
                host = await anyio.to_thread.run_sync(self.make_host, entry)
            host.model_id = entry.id
            lane = Lane(entry, TextService(self.settings, host, started=int(time.time())),
                        keep_alive=self.settings.keep_alive)
            self.loaded[entry.id] = lane
            self._start_reaper()
            done.set_result(lane)
        except Exception as e:  # noqa: BLE001 - every waiter gets the reason
            log.error("Loading %s failed: %s", entry.id, e)
            done.set_exception(e if isinstance(e, ServiceUnavailableError) else ServiceUnavailableError(
                f"The model {entry.id} could not be loaded ({type(e).__name__}: {str(e)[:200]}).",
                code="model_load_failed"))
        finally:
            self._loading.pop(entry.id, None)

    def _default_size(self) -> int:
        path = getattr(self.default.host, "path", None)
        return path.stat().st_size if isinstance(path, Path) and path.exists() else 0

    @property
    def _budget(self) -> float:
        """Bytes the loaded models' files may take (0: no bound but their count)."""
        return self.settings.models_memory_mb * 1e6

    def _over_budget(self, entry: Entry) -> bool:
        budget = self._budget
        used = sum(lane.entry.size for lane in self.loaded.values()) + entry.size + self._default_size()
        too_many = len(self.loaded) + 1 > max(0, self.settings.max_loaded_models - 1)   # the default counts
        return too_many or (budget > 0 and used > budget)

    async def _make_room(self, entry: Entry) -> None:
        """Unloads idle models, least recently used first, until ``entry`` fits; waits while the
        models in the way are busy. A model that cannot fit even alone is refused."""
        alone = entry.size + self._default_size()
        budget = self._budget
        if self.settings.max_loaded_models < 2 or (budget > 0 and alone > budget):
            raise ServiceUnavailableError(
                f"The model {entry.id} ({entry.size / 1e6:.0f} MB) does not fit beside the default model: "
                f"models_memory_mb is {self.settings.models_memory_mb} and max_loaded_models "
                f"{self.settings.max_loaded_models}. Raise them, or load it as the default model.",
                code="model_budget_exceeded", retry=False)
        while self._over_budget(entry):
            now = time.monotonic()
            idle = sorted((lane for lane in self.loaded.values()
                           if lane.idle_for(now) >= min(self.grace, ROOM_GRACE)),
                          key=lambda lane: lane.idle_for(now), reverse=True)
            if idle:
                await self._unload(idle[0], "to make room for " + entry.id)
            else:
                await asyncio.sleep(0.2)   # the models in the way are busy: wait until one is idle

    async def _unload(self, lane: Lane, why: str) -> None:
        """Closes an idle model the way a model change does (text.service.change_model): after
        its line's last request and any tokenizing in flight; a request that still holds its
        service (it picked it before the unload) gets a 503 telling it to send again."""
        if self.loaded.get(lane.entry.id) is not lane:
            return
        del self.loaded[lane.entry.id]
        log.info("Unloading %s (%s)", lane.entry.id, why)

        def close(old: Host) -> Host:
            old.close()
            return NoModel(message=f"The model {lane.entry.id} was unloaded while this request waited; send it "
                                   "again.", code="model_unloaded")

        await lane.text.change_model(close)
        lane.text.close()

    # --- idle unload ----------------------------------------------------------------------------

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())

    async def _reap(self) -> None:
        while self.loaded and not self._closed:
            await asyncio.sleep(max(0.05, min(REAP_EVERY, self.grace)))
            now = time.monotonic()
            for lane in list(self.loaded.values()):
                # keep_alive 0 waits out the grace too: its request may not have queued yet
                if (lane.keep_alive != FOREVER and lane.idle_for(now) >= lane.keep_alive
                        and now - lane.picked >= self.grace):
                    await self._unload(lane, f"idle for {lane.keep_alive:g} s")

    # --- what is told ---------------------------------------------------------------------------

    def cards(self, started: int) -> list[dict[str, Any]]:
        default = self.default.host.model_id
        return [card(e.id, started, "local") for e in self.entries.values() if e.id != default]

    def describe(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{"id": lane.entry.id, "file": lane.entry.path.name, "size_mb": round(lane.entry.size / 1e6, 1),
                 "running": lane.text.queue.running, "queued": lane.text.queue.waiting,
                 "idle_s": round(lane.idle_for(now), 1),
                 "keep_alive_s": None if lane.keep_alive == FOREVER else lane.keep_alive}
                for lane in self.loaded.values()]

    def hosts(self) -> list[Host]:
        return [lane.text.host for lane in self.loaded.values()]

    def loading(self) -> list[str]:
        return sorted(self._loading)

    def close(self) -> None:
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        for lane in list(self.loaded.values()):
            lane.text.close()
            with contextlib.suppress(Exception):
                lane.text.host.close()
        self.loaded.clear()
