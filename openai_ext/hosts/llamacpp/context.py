"""Loading a GGUF model and its context for the embedded llama.cpp host (and for the CPU test of
llamacpp/probe.py, which must load them exactly as the host does), and ``Runtime``: the loaded pair
with the per-token operations that the host, the batch's works and the sampling share."""

from __future__ import annotations

import ctypes
import multiprocessing
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..base import TokenLogprob

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
    types (repacked layouts, AMX tiles), see llamacpp/probe.py."""
    L = lazy_llama()
    from llama_cpp._internals import LlamaModel

    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers == -1 else n_gpu_layers
    mparams.use_extra_bufts = extra_buffers
    return LlamaModel(path_model=str(path), params=mparams, verbose=False)


def load_context(model: Any, *, n_ctx: int, parallel: int, n_threads: int | None = None,
                 flash_attn: str = "auto", cache_type_v: str = "f16") -> Any:
    """A context of ``n_ctx`` cells (0: the model's own length) shared by ``parallel`` sequences;
    ``cache_type_v``: how the cells keep their values (see value_cache_type)."""
    L = lazy_llama()
    from llama_cpp._internals import LlamaContext

    n_ctx = n_ctx or model.n_ctx_train()
    cparams = L.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = min(N_BATCH, n_ctx)
    cparams.n_seq_max = parallel
    # One KV cache for all sequences (see llamacpp/batch.py): a request may use the whole context.
    cparams.kv_unified = True
    cparams.n_threads = n_threads or max(multiprocessing.cpu_count() // 2, 1)
    cparams.n_threads_batch = multiprocessing.cpu_count()
    cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO if uses_flash_attn(flash_attn, parallel) \
        else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    # (llama-cpp-python names no GGML_TYPE_BF16: it is 30 in ggml.h)
    cparams.type_v = {"f16": L.GGML_TYPE_F16, "bf16": 30, "q8_0": L.GGML_TYPE_Q8_0}[cache_type_v]
    return LlamaContext(model=model, params=cparams, verbose=False)


def value_cache_type(setting: str, *, flash_attn: bool, n_gpu_layers: int) -> str | None:
    """How the KV cells keep their values, as far as the setting and the device decide it; None
    where "auto" is left to a timing of this machine (flash attention on the CPU: llamacpp/values.py
    says why). A GPU keeps f16 (its kernels sum either alike), and without flash attention
    llama.cpp keeps values only in f16 or bf16."""
    if setting == "auto":
        return None if flash_attn and n_gpu_layers == 0 else "f16"
    if setting == "q8_0" and not flash_attn:
        raise ValueError("cache_type_v q8_0 needs flash attention: set flash_attn on, or cache_type_v f16")
    return setting


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


# Logits rows whose views are kept (Runtime.logits): a batch's outputs, a few buffers over.
MAX_VIEWS = 8192


class Runtime:
    """A loaded model and its context: llama.cpp's handles, the vocabulary's facts and the
    operations on single tokens. The host creates and closes it (so a model change frees both in
    one place); the works of the batch (llamacpp/work.py) and the sampling (llamacpp/sampling.py) are
    handed it. Its fields are plain attributes because they are read on every token.

    ``L``: the llama_cpp module; ``model``, ``context``: llama-cpp-python's wrappers; ``vocab``,
    ``ctx``: their C handles; ``n_vocab``; ``context_length``: the cells one sequence may use;
    ``bos``, ``add_bos``; ``eog``: for each token id, whether it ends a generation."""

    def __init__(self, path: Path, *, extra_buffers: bool, n_gpu_layers: int, n_ctx: int, parallel: int,
                 n_threads: int | None, flash_attn: str, cache_type_v: str = "auto",
                 choose_values: Callable[[Any], str] | None = None):
        L = self.L = lazy_llama()
        fixed = value_cache_type(cache_type_v, flash_attn=uses_flash_attn(flash_attn, parallel),
                                 n_gpu_layers=n_gpu_layers)
        self.model = load_model(path, extra_buffers=extra_buffers, n_gpu_layers=n_gpu_layers)
        try:
            # "auto" on the CPU: the host times both kinds with this model (llamacpp/values.py)
            self.cache_type_v: str = fixed or (choose_values(self.model) if choose_values else "f16")
            self.context = load_context(self.model, n_ctx=n_ctx, parallel=parallel, n_threads=n_threads,
                                        flash_attn=flash_attn, cache_type_v=self.cache_type_v)
        except BaseException:
            self.model.close()
            raise
        self.vocab = self.model.vocab
        self.ctx = self.context.ctx
        self.n_vocab: int = L.llama_vocab_n_tokens(self.vocab)
        self.context_length: int = L.llama_n_ctx_seq(self.ctx)
        self.bos: int = L.llama_vocab_bos(self.vocab)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.eog = np.array([L.llama_vocab_is_eog(self.vocab, t) for t in range(self.n_vocab)], dtype=bool)
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._views: dict[int, np.ndarray] = {}   # logits rows by address (see logits)

    def piece(self, token: int, special: bool) -> bytes:
        """The bytes of ``token``; ``special``: control tokens give their text rather than none."""
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            buf = ctypes.create_string_buffer(256)
            n = self.L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            piece = buf.raw[:max(n, 0)]
            self._pieces[key] = piece
        return piece

    def logits(self, output: int) -> np.ndarray:
        """The logits of decoder output ``output`` (its index in the last batch), in place: valid
        until the next decode.

        The view of a row is kept by its address, which llama.cpp gives again while its buffer
        stays: made fresh after every decode, when the caches hold the model's weights instead of
        numpy's, the view took 25-45 us, more than the argmax read through it (one stream: a step
        is 7-9 ms, with about 0.25 ms of Python between two)."""
        row = self.L.llama_get_logits_ith(self.ctx, output)
        address = ctypes.cast(row, ctypes.c_void_p).value or 0
        view = self._views.get(address)
        if view is None:
            if len(self._views) >= MAX_VIEWS:   # (a buffer made again elsewhere: the old rows go)
                self._views.clear()
            view = self._views[address] = np.ctypeslib.as_array(row, shape=(self.n_vocab,))
        return view

    def logprob(self, output: int, token: int, top: int) -> TokenLogprob:
        """The log-probability of ``token`` under the logits of decoder output ``output``,
        with the ``top`` most likely alternatives."""
        logits = self.logits(output)
        m = float(logits.max())
        logz = m + float(np.log(np.exp(logits - m).sum()))

        def item(t: int) -> tuple[str, float, list[int]]:
            raw = self.piece(t, True)
            return raw.decode("utf-8", errors="replace"), float(logits[t]) - logz, list(raw)

        entry = TokenLogprob(*item(token))
        if top > 0:
            best = np.argpartition(-logits, top)[:top]
            entry.top = [item(int(t)) for t in best[np.argsort(-logits[best])]]
        return entry

    def grammar_sampler(self, gbnf: str) -> Any:
        """llama.cpp's sampler for the GBNF grammar ``gbnf`` (rule ``root``); the caller frees it
        (``L.llama_sampler_free``). ValueError when llama.cpp cannot parse it."""
        smpl = self.L.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        if not smpl:
            raise ValueError("llama.cpp could not parse the grammar built for this request")
        return smpl

    def close(self) -> None:
        self.context.close()
        self.model.close()
