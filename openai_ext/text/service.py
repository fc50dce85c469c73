"""The text family's shared parts: the host that serves now, its line of requests, the thread
that generates, and the one place where a text request goes from validated body to response.

- ``queue`` admits at most ``max_queue`` waiting requests (more get a 429 at once) and lets as
  many generations run at once as the host serves (``HostAbilities.parallel``: the embedded
  llama.cpp host's ``parallel`` setting, the sequences it decodes as one batch; the web UI's
  parallel slots, its llama.cpp with --parallel N; one everywhere else), first come first served.
  In extension mode the host's own generation lock is taken inside ``generate_reply`` as well,
  except on parallel loaders; this line makes the order fair.
- ``worker`` holds the long-lived threads that run the hosts' blocking calls: one per running
  choice (a request's choices run together on a host that batches). Idle threads are reused, so a
  host that generates one at a time keeps one thread: a fresh thread per request costs time to
  first token there (llama.cpp's compute threads are set up per calling thread).
- ``prepare`` runs prompt rendering and tokenizing on a worker thread, one request at a time (a
  tokenizer may not be safe to share between threads), so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
from typing import TYPE_CHECKING, Any, AsyncGenerator, Awaitable, Callable, Protocol, TypeVar

import anyio
from fastapi import Request

from ..core.admission import Admission, Place
from ..core.catalog import card
from ..core.config import Settings
from ..core.errors import ServiceUnavailableError
from ..core.streaming import Framed, Framing, event_stream, until_disconnect
from ..documents.inputs import Reader
from ..hosts.base import Host
from ..hosts.manager import ModelChangeFailed, NoModel

if TYPE_CHECKING:
    from .params import Plan

T = TypeVar("T")


class Catalog(Protocol):
    """Standalone's other models, by name (``text.lanes.Lanes``): the default model's service
    holds it and hands each request the service of the model it names."""

    async def lane(self, model: str | None, keep_alive: float | int | str | None) -> "TextService": ...

    def cards(self, started: int) -> list[dict[str, Any]]: ...

    def describe(self) -> list[dict[str, Any]]: ...

    def loading(self) -> list[str]: ...

    def hosts(self) -> list[Host]: ...

    def close(self) -> None: ...


def _threads(slots: int) -> int:
    """Threads for ``slots`` running requests: each with up to that many choices at once (a
    request's choices run together on a host that batches), one more each for echo's scoring
    pass, and one for a model change."""
    return slots * (slots + 1) + 1


class TextService:
    def __init__(self, settings: Settings, host: Host, *, started: int):
        self.settings = settings
        self.started = started
        self.queue = Admission("generation", max_waiting=settings.max_queue)
        self.host = host
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=_threads(1), thread_name_prefix="generation")
        self._prepare: anyio.CapacityLimiter | None = None
        self._exclusive = 0   # model changes waiting for, or holding, the model alone
        self.lanes: Catalog | None = None   # standalone's other models by name (the default model's service only)
        self.file_reader: Reader | None = None   # chat's file parts, read from the Files API (state.py sets it)

    async def lane(self, model: str | None, keep_alive: float | int | str | None = None) -> "TextService":
        """The service for a request that names ``model``: a catalog model's own (loaded on
        demand), or this one. Every family's text request picks its lane first."""
        return self if self.lanes is None else await self.lanes.lane(model, keep_alive)

    def follow_host(self) -> None:
        """Runs as many generations at once as the host serves now (the user may load another
        model, or the same one with another number of slots, at any time)."""
        slots = max(1, self.host.abilities.parallel)
        if slots == self.queue.capacity or self._exclusive:
            return
        self.queue.resize(slots)
        old, self.worker = self.worker, concurrent.futures.ThreadPoolExecutor(
            max_workers=_threads(slots), thread_name_prefix="generation")
        old.shutdown(wait=False)   # its running generations finish on their threads

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncGenerator[None, None]:
        """A turn in line during which nothing else runs (a model or LoRA change): the line
        is narrowed to one until the generations already running have finished."""
        self._exclusive += 1
        try:
            self.queue.resize(1)
            async with self.queue.admit():
                yield
        finally:
            self._exclusive -= 1
            self.follow_host()

    async def change_model(self, change: Callable[[Host], Host]) -> None:
        """The one place the serving host is replaced (model load and unload): ``change(old)``
        runs on the generation thread while no generation runs (it takes its turn in line) and no
        prompt is being prepared, and its host serves from then on.

        While it runs, a placeholder serves: generations and tokenizer routes answer 503 rather than
        reach a model that is being closed. The change is shielded from cancellation: a client that
        goes away must not leave the placeholder serving once the load is done."""
        async with self.exclusive(), self.prepare_limiter:
            old = self.host
            self.host = NoModel(old.describe().get("loader"), code="model_changing",
                                message="The model is being changed; retry in a moment.")
            with anyio.CancelScope(shield=True):
                try:
                    self.host = await self.run(change, old)
                except ModelChangeFailed as e:
                    self.host = e.serving
                    raise
                except BaseException:
                    self.host = old   # refused before anything changed (a bad name or args)
                    raise

    @property
    def prepare_limiter(self) -> anyio.CapacityLimiter:
        """One prompt prepared at a time (made on first use, inside the event loop)."""
        if self._prepare is None:
            self._prepare = anyio.CapacityLimiter(1)
        return self._prepare

    async def prepared(self, prepare: Callable[..., T], *args: Any) -> T:
        """``prepare(*args)``, a request's rendering and tokenizing, on the prepare thread (one
        request at a time): every 400 of a text request happens there, before anything runs."""
        return await anyio.to_thread.run_sync(prepare, *args, limiter=self.prepare_limiter)

    async def tokenizer_work(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A tokenizer call, run as prompts are prepared: on a worker thread, one at a time."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.prepare_limiter)

    def run(self, fn: Callable[..., Any], *args: Any) -> "asyncio.Future[Any]":
        """Runs a blocking host call on the generation thread."""
        return asyncio.wrap_future(self.worker.submit(fn, *args))

    @property
    def fingerprint(self) -> str:
        """Changes when the model or its backend changes, as OpenAI's system_fingerprint does,
        so clients can tell when the same seed may give different text."""
        basis = f"{self.host.model_id}|{type(self.host).__name__}|{self.host.context_length()}"
        return "fp_" + hashlib.sha256(basis.encode()).hexdigest()[:10]

    def require_model(self) -> None:
        host = self.host
        if isinstance(host, NoModel) and host.code != "model_not_loaded":
            raise ServiceUnavailableError(host.message, code=host.code)   # changing, or unloaded: why
        if not host.loaded:
            raise ServiceUnavailableError("No model is loaded. Load one in the web UI, or with POST "
                                          "/v1/internal/model/load.", code="model_not_loaded")
        problem = self.host.unavailable()
        if problem is not None:
            raise problem

    def model_cards(self) -> list[dict[str, Any]]:
        host = self.host
        cards = [card(host.model_id, host.created or self.started, host.owned_by)] if host.loaded else []
        return cards + (self.lanes.cards(self.started) if self.lanes is not None else [])

    def close(self) -> None:
        if self.lanes is not None:
            self.lanes.close()
        self.worker.shutdown(wait=False, cancel_futures=True)


class Planned(Protocol):
    """A prepared text request: its plan says whether it streams."""
    @property
    def plan(self) -> Plan: ...


Body = TypeVar("Body", contravariant=True)
PlannedJob = TypeVar("PlannedJob", bound=Planned)


class TextEndpoint(Protocol[Body, PlannedJob]):
    """What an endpoint module (chat, completions, Messages) offers: ``prepare`` validates a
    ``Body`` into a job, on a worker thread; ``complete`` and ``stream`` run it. An endpoint of
    another API has its stream's ``framing`` (None: OpenAI's; see core.streaming); a stream may
    yield chunks already framed (core.streaming.Framed)."""
    framing: Framing | None

    def prepare(self, text: TextService, body: Body, /) -> PlannedJob: ...

    async def complete(self, text: TextService, job: PlannedJob, place: Place, /) -> dict[str, Any]: ...

    def stream(self, text: TextService, job: PlannedJob, place: Place,
               /) -> AsyncGenerator[dict[str, Any] | Framed, None]: ...


def enter(text: TextService) -> Place:
    """The front door of every text request (chat, completions, Messages, Responses and its
    compaction): the model checked, the line sized to the host's slots, and a place in line
    taken, first, so that when the line is full the 429 comes at once, before any work. The
    caller gives the place back if it fails before running (``admit`` does)."""
    text.require_model()
    text.follow_host()
    return text.queue.admit()


async def admit(text: TextService, prepare: Callable[..., T], *args: Any) -> tuple[T, Place]:
    """``enter``, then ``prepare(*args)`` run on the prepare thread. Every 400 happens in
    ``prepare``, before anything runs, and a request that fails there gives its place back."""
    place = enter(text)
    try:
        job = await text.prepared(prepare, *args)
    except BaseException:
        place.release()
        raise
    return job, place


async def serve(text: TextService, request: Request, place: Place, *, events: AsyncGenerator[Any, None] | None,
                answer: Callable[[], Awaitable[Any]], framing: Framing | None,
                on_close: Callable[[], None] | None = None) -> Any:
    """The way out of every text request that holds its place: a stream of ``events`` (the
    place given back when the stream closes, then ``on_close``), or the awaited ``answer``
    (None ``events``), cut when the client leaves; the place is given back either way."""
    if events is not None:
        def closed() -> None:
            place.release()
            if on_close is not None:
                on_close()
        return event_stream(events, send_timeout=text.settings.stream_send_timeout, on_close=closed, framing=framing)
    try:
        return await until_disconnect(request, answer())
    finally:
        place.release()


async def generate(text: TextService, request: Request, endpoint: TextEndpoint[Body, PlannedJob], body: Body) -> Any:
    """Runs one text request from its validated body to its response."""
    job, place = await admit(text, endpoint.prepare, text, body)
    return await serve(text, request, place, events=endpoint.stream(text, job, place) if job.plan.stream else None,
                       answer=lambda: endpoint.complete(text, job, place), framing=endpoint.framing)
