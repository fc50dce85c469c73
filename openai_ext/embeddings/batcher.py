"""Dynamic batching of embedding requests: the requests that arrive together share one encode.

Every call into the engine is made by the batcher's single worker thread (engines are not assumed
to be thread-safe). A batch closes when no request arrived for ``gap_s`` or ``window_s`` after its
first one, or at ``max_batch`` inputs; a large request is split over several batches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..core.errors import ServiceUnavailableError
from .engine import EmbeddingEngine, load_engine, matryoshka

if TYPE_CHECKING:
    from ..core.config import Settings

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    texts: list[str]
    dimensions: int | None
    # an asyncio future of `loop` for requests on an event loop, else a concurrent future
    future: asyncio.Future | concurrent.futures.Future
    loop: asyncio.AbstractEventLoop | None
    submitted: float
    cursor: int = 0                                        # texts handed to a batch so far
    parts: list[tuple[int, np.ndarray, list[int]]] = field(default_factory=list)
    done_count: int = 0                                    # texts encoded so far

    @property
    def left(self) -> int:
        return len(self.texts) - self.cursor

    def gone(self) -> bool:
        """The request was cancelled (its client left): nothing more is done for it."""
        return self.future.cancelled()

    def finish_part(self, start: int, vectors: np.ndarray, counts: list[int]) -> tuple | None:
        """Records a slice; returns the whole result once every slice is in."""
        self.parts.append((start, vectors, counts))
        self.done_count += len(counts)
        if self.done_count < len(self.texts):
            return None
        self.parts.sort(key=lambda p: p[0])
        vectors = np.concatenate([p[1] for p in self.parts]) if len(self.parts) > 1 else self.parts[0][1]
        return vectors, [c for p in self.parts for c in p[2]]


def _settle(future: asyncio.Future | concurrent.futures.Future, result=None,
            error: BaseException | None = None) -> None:
    if future.done():
        return    # cancelled: the client left while its batch ran
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except (concurrent.futures.InvalidStateError, asyncio.InvalidStateError):
        pass      # cancelled just now


def _settle_all(items: list[tuple[asyncio.Future, tuple | None, BaseException | None]]) -> None:
    for future, result, error in items:
        _settle(future, result, error)


class _Deliveries:
    """Results to hand back. Requests waiting on an event loop get theirs in one call per loop and
    batch, so the loop is woken once per batch rather than once per request."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list] = {}

    def add(self, job: _Job, result: tuple | None = None, error: BaseException | None = None) -> None:
        if job.loop is None:
            _settle(job.future, result, error)
        else:
            self._by_loop.setdefault(job.loop, []).append((job.future, result, error))

    def send(self) -> None:
        for loop, items in self._by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_all, items)
            except RuntimeError:
                pass      # that loop is closed: nobody waits there any more
        self._by_loop.clear()


def _fail_all(jobs: Sequence[_Job], error: BaseException) -> None:
    deliveries = _Deliveries()
    for job in jobs:
        deliveries.add(job, error=error)
    deliveries.send()


@dataclass
class BatchStats:
    batches: int = 0
    inputs: int = 0
    largest: int = 0
    busy_s: float = 0.0       # time spent in the engine: the rest of the time it waited for work

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "busy_s": round(self.busy_s, 4),
                "mean": round(self.inputs / self.batches, 2) if self.batches else 0.0}


class Batcher:
    """Gathers concurrent requests into one encode call on one worker thread.

    A batch closes at the first of:

    - ``max_batch`` inputs are waiting;
    - ``gap_s`` has passed with no sign of more work coming: no request arrived, and no result of
      the last batch was picked up by the event loop (while the loop is still handing those out,
      the clients that got them have not had the chance to send their next request yet);
    - ``window_s`` after the batch could have started: after its oldest request arrived, and not
      before the previous batch ended. This caps the wait under a steady trickle of requests.

    So a lone request waits ``gap_s``; clients that come back together after their answers go
    in one batch even when the event loop takes longer than ``gap_s`` to hand out the answers and
    read the next requests; and ``window_s`` 0 means no waiting at all. A request larger than
    ``max_batch`` is encoded in slices, taken in turn with the other requests, so a big request
    does not hold small ones up for its whole length. The worker thread starts on demand and ends
    after ``idle_s`` without work.

    The event loop's share of the work is kept small, as it is done once per request: a request
    waits on a plain asyncio future, arrivals do not wake a worker that is gathering, and a
    batch's results reach each event loop in one call.
    """

    def __init__(self, engine: EmbeddingEngine, window_s: float, max_batch: int, gap_s: float = 0.002,
                 idle_s: float = 2.0):
        self.engine = engine
        self.window_s = max(0.0, window_s)
        self.gap_s = max(0.0, gap_s)
        self.max_batch = max(1, max_batch)
        self.idle_s = idle_s
        self.stats = BatchStats()
        self._pending: deque[_Job] = deque()
        self._queued = 0            # inputs in _pending not yet handed to a batch
        self._activity = 0.0        # when a request last arrived or a result was last picked up
        self._free_since = 0.0      # when the last batch ended
        self._idle = False          # the worker waits for work (not gathering a batch)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, texts: Sequence[str], dimensions: int | None = None) -> concurrent.futures.Future:
        """A future of (float32 vectors (N, D), token counts); thread-safe."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not texts:
            future.set_result(self._empty(dimensions))
            return future
        self._enqueue(texts, dimensions, future, None)
        return future

    async def embed(self, texts: Sequence[str], dimensions: int | None = None) -> tuple[np.ndarray, list[int]]:
        """(float32 vectors (N, D), token counts), for a request on the running event loop.
        Cancelling the awaiting task drops the request: the worker skips it."""
        if not texts:
            return self._empty(dimensions)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._enqueue(texts, dimensions, future, loop)
        try:
            return await future
        finally:
            self._activity = time.monotonic()    # a result picked up: its client may come back soon

    def _empty(self, dimensions: int | None) -> tuple[np.ndarray, list[int]]:
        return np.zeros((0, dimensions or self.engine.dimension), np.float32), []

    def _enqueue(self, texts: Sequence[str], dimensions: int | None, future, loop) -> None:
        now = time.monotonic()
        job = _Job(list(texts), dimensions, future, loop, now)
        with self._cond:
            if self._closed:
                raise ServiceUnavailableError("The embedding engine is shutting down; retry in a moment.")
            self._pending.append(job)
            self._queued += len(job.texts)
            self._activity = now
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="embedding-batcher", daemon=True)
                self._thread.start()
            elif self._idle or self._queued >= self.max_batch:
                # Only these wake the worker: while it gathers a batch it sleeps until the gap
                # could have passed, instead of taking the GIL from the event loop on every arrival.
                self._cond.notify()

    def embed_blocking(self, texts: Sequence[str], dimensions: int | None = None) -> tuple[np.ndarray, list[int]]:
        """For worker threads (never the event loop): goes through the same single worker."""
        return self.submit(texts, dimensions).result()

    def close(self) -> None:
        """Fails what is waiting and lets the worker end."""
        with self._cond:
            self._closed = True
            pending, self._pending, self._queued = list(self._pending), deque(), 0
            self._cond.notify_all()
        _fail_all(pending, ServiceUnavailableError("The embedding engine was shut down."))

    @property
    def running(self) -> bool:
        return self._thread is not None

    # --- the worker thread ---

    def _take_batch(self) -> list[tuple[_Job, int, int]] | None:
        """Waits for work and returns slices (job, start, end), or None when the thread should end."""
        with self._cond:
            while True:
                if not self._wait_for_work():
                    self._thread = None
                    return None
                self._gather()
                if self._live_pending():       # empty when every request waiting was cancelled
                    return self._slices()

    def _wait_for_work(self) -> bool:
        while not self._live_pending():
            if self._closed:
                return False
            self._idle = True
            woken = self._cond.wait(self.idle_s)
            self._idle = False
            if not woken and not self._live_pending():
                return False
        return True

    def _gather(self) -> None:
        """Sleeps until the batch should close (see the class docstring)."""
        deadline = max(self._pending[0].submitted, self._free_since) + self.window_s
        while self._queued < self.max_batch and not self._closed:
            now = time.monotonic()
            close_at = min(deadline, max(self._activity, self._free_since) + self.gap_s)
            if now >= close_at:
                return
            self._cond.wait(close_at - now)
            self._live_pending()

    def _slices(self) -> list[tuple[_Job, int, int]]:
        room = self.max_batch
        batch: list[tuple[_Job, int, int]] = []
        while room > 0 and self._pending:
            job = self._pending.popleft()
            take = min(room, job.left)
            batch.append((job, job.cursor, job.cursor + take))
            job.cursor += take
            self._queued -= take
            room -= take
            if job.left:
                self._pending.append(job)   # the rest waits its turn behind the other requests
        return batch

    def _live_pending(self) -> bool:
        """Drops cancelled requests from the queue; true if any request is waiting."""
        if any(job.gone() for job in self._pending):
            self._drop(_Job.gone)
        return bool(self._pending)

    def _drop(self, which: Callable[[_Job], bool]) -> None:
        """Removes the matching requests from the queue (with the lock held)."""
        kept = deque(job for job in self._pending if not which(job))
        self._queued = sum(job.left for job in kept)
        self._pending = kept

    def _work(self) -> None:
        try:
            while (batch := self._take_batch()) is not None:
                self._run(batch)
                self._free_since = time.monotonic()
        except BaseException as e:
            # not expected (engine failures are handled in _run), but no request may wait forever
            log.exception("the embedding batcher stopped")
            with self._cond:
                self._thread = None
                pending, self._pending, self._queued = list(self._pending), deque(), 0
            _fail_all(pending, e)
            raise

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """Full-width rows and token counts, tokenizing once where the engine can."""
        both = getattr(self.engine, "embed_counted", None)
        if both is not None:
            vectors, counts = both(texts)
        else:
            counter = getattr(self.engine, "count_tokens", None)
            counts = counter(texts) if counter else [len(t.split()) for t in texts]
            vectors = self.engine.embed(texts, None)
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts) or len(counts) != len(texts):
            raise RuntimeError(f"the embedding engine returned an array of shape {vectors.shape} "
                               f"for {len(texts)} texts")
        return vectors, list(counts)

    def _run(self, batch: list[tuple[_Job, int, int]]) -> None:
        texts = [t for job, start, end in batch for t in job.texts[start:end]]
        try:
            # One encode at full width for the whole batch; each request's `dimensions` is applied
            # here, so every engine gives unit float32 rows of the asked width, whatever it returns.
            started = time.perf_counter()
            vectors, counts = self._encode(texts)
            self.stats.busy_s += time.perf_counter() - started
            results = []
            offset = 0
            for job, start, end in batch:
                results.append(matryoshka(vectors[offset:offset + end - start], job.dimensions))
                offset += end - start
        except Exception as e:  # noqa: BLE001 - a request's failure is its own, not its neighbours'
            if len({id(job) for job, _, _ in batch}) > 1:
                # One member's input may be what broke the batch: each request is run again on
                # its own, so the others are answered as if it had not been there.
                log.warning("an embedding batch of %d inputs failed (%s); its requests run one by one",
                            len(texts), type(e).__name__)
                for item in batch:
                    self._run([item])
                return
            log.exception("embedding batch of %d inputs failed", len(texts))
            failed = {id(job): job for job, _, _ in batch}
            with self._cond:
                # the rest of a failed request is not encoded
                self._drop(lambda job: id(job) in failed)
            _fail_all(list(failed.values()), e)
            return
        self.stats.batches += 1
        self.stats.inputs += len(texts)
        self.stats.largest = max(self.stats.largest, len(texts))
        deliveries = _Deliveries()
        offset = 0
        for (job, start, end), vectors in zip(batch, results, strict=True):
            whole = job.finish_part(start, vectors, counts[offset:offset + end - start])
            if whole is not None:
                deliveries.add(job, whole)
            offset += end - start
        deliveries.send()


def load_batcher(settings: Settings) -> Batcher:
    engine = load_engine(settings)
    return Batcher(engine, settings.embedding_batch_window_ms / 1000, settings.embedding_max_batch,
                   gap_s=settings.embedding_batch_gap_ms / 1000)
