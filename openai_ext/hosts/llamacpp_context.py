"""Loading a GGUF model and its context for the embedded llama.cpp host (and for the CPU test of
llamacpp_probe, which must load them exactly as the host does)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

# Tokens decoded in one step at most, and prompt tokens read per step while others generate.
N_BATCH = 512
PREFILL_CHUNK = 128

_backend_ready = False


def lazy_llama():
    """llama-cpp-python, imported (and llama.cpp's backend started) on first use."""
    global _backend_ready
    try:
        import llama_cpp
        from llama_cpp._logger import set_verbose
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SystemExit("Standalone mode needs llama-cpp-python: pip install -r requirements.txt") from e
    if not _backend_ready:
        set_verbose(False)
        llama_cpp.llama_backend_init()
        _backend_ready = True
    return llama_cpp


def load_model(path: Path, *, extra_buffers: bool, n_gpu_layers: int = 0) -> Any:
    """The model's weights; ``extra_buffers``: llama.cpp may put them in its extra CPU buffer
    types (repacked layouts, AMX tiles), see llamacpp_probe."""
    L = lazy_llama()
    from llama_cpp._internals import LlamaModel

    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers == -1 else n_gpu_layers
    mparams.use_extra_bufts = extra_buffers
    return LlamaModel(path_model=str(path), params=mparams, verbose=False)


def load_context(model: Any, *, n_ctx: int, parallel: int, n_threads: int | None = None,
                 flash_attn: str = "auto") -> Any:
    """A context of ``n_ctx`` cells (0: the model's own length) shared by ``parallel`` sequences."""
    L = lazy_llama()
    from llama_cpp._internals import LlamaContext

    n_ctx = n_ctx or model.n_ctx_train()
    cparams = L.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = min(N_BATCH, n_ctx)
    cparams.n_seq_max = parallel
    # One KV cache for all sequences (see llamacpp_batch): a request may use the whole context.
    cparams.kv_unified = True
    cparams.n_threads = n_threads or max(multiprocessing.cpu_count() // 2, 1)
    cparams.n_threads_batch = multiprocessing.cpu_count()
    cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO if uses_flash_attn(flash_attn, parallel) \
        else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return LlamaContext(model=model, params=cparams, verbose=False)


def uses_flash_attn(setting: str, parallel: int) -> bool:
    """Flash attention skips the cells of other sequences where the plain path multiplies through
    them: with other sequences' prefixes cached in the shared cache, one stream decodes at 115-125
    tokens/s instead of 61 (eight streams at the same speed), measured on two cores with the
    embedded model. But it splits long attention spans between threads, so its sums depend on
    where a sequence's cells lie and on the thread count: the same request may come out another
    way. With one sequence there is no one else's cells to skip (it gains 14% there) and the plain
    path gives the same answer to the same request, so "auto" keeps that path for parallel 1.
    "on" means where the device has it (llama.cpp's auto)."""
    return setting == "on" or (setting == "auto" and parallel > 1)
