"""How the KV cells keep their values (``cache_type_v``) where flash attention runs on the CPU:
f16 or q8_0, whichever this machine decodes faster.

llama.cpp's flash attention on the CPU sums the values a token attends to in the values' own
type. f16 values are summed with its f16 vectors, but only over whole vector steps: 64 elements
with plain AVX-512, 128 where the build uses AVX-512 FP16 arithmetic (a native build on a Xeon
since Sapphire Rapids). A value head of 64 elements (SmolLM2, Qwen2.5 0.5B, Llama 3.2 1B) is then
summed one element at a time: with the embedded model, one token 2,400 cells deep took 78 ms with
f16 values and 27 ms with q8_0 values, which are converted to f32 and summed as such. On an
AVX-512 CPU without FP16 arithmetic (AMD EPYC, Zen 4) the same library did the opposite: 15.7 ms
with f16 values and 21.0 ms with q8_0 (sixteen tokens: 164 and 230 ms), and Qwen2.5-Coder 0.5B
3,300 cells deep 32 and 39 ms.

No flag of the build says which kernels it has, so "auto" times one token's decode deep in a
small context with each, once per model file, llama.cpp build and CPU (kept beside the CPU test's
verdicts), and keeps f16 (exact to the last bit of its type) unless q8_0 is clearly faster. A
value head of a whole number of 128-element steps is summed in whole steps on every build, so
such a model keeps f16 untimed.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .context import lazy_llama, load_context
from .plan import write
from .probe import keep, probe_key, read_verdicts
from .threads import usable_cpus

# Cells filled before the timed decodes (one batch), and the decodes timed (the fastest counts).
DEPTH = 512
REPEATS = 5
KINDS = ("f16", "q8_0")
# q8_0 is chosen only when it takes less than this share of f16's time (f16 is the exact one).
CLEARLY = 0.85


@dataclass(frozen=True)
class ValueChoice:
    kind: str       # "f16" or "q8_0"
    reason: str

    def line(self) -> str:
        return f"KV cache values: {self.kind}: {self.reason}"


def pick(f16_s: float, q8_s: float) -> str:
    return "q8_0" if q8_s < CLEARLY * f16_s else "f16"


def value_head(model: Any) -> int | None:
    """Elements in one attention head's values, from the GGUF's metadata (None when it says not)."""
    meta = model.metadata()
    arch = meta.get("general.architecture", "")
    try:
        if f"{arch}.attention.value_length" in meta:
            return int(meta[f"{arch}.attention.value_length"])
        return int(meta[f"{arch}.embedding_length"]) // int(meta[f"{arch}.attention.head_count"])
    except (KeyError, ValueError, ZeroDivisionError):
        return None


def time_decodes(model: Any, n_threads: int) -> dict[str, float]:
    """For f16 and q8_0 values: seconds of the fastest of REPEATS one-token decodes DEPTH cells
    deep. The two contexts take turns, so a moment when other work takes the CPU hits both alike."""
    L = lazy_llama()
    words = model.tokenize(b" river stone lantern harbor meadow copper violet engine", add_bos=False, special=False)
    tokens = (words * (DEPTH // max(len(words), 1) + 1))[:DEPTH]
    batch = L.llama_batch_init(DEPTH, 0, 1)
    contexts: dict[str, Any] = {}
    try:
        def decode(ctx: Any, toks: list[int], at: int) -> None:
            write(batch, [(0, toks, at, len(toks) - 1)])   # (logits for the last token only)
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed while timing the KV value types")

        for kind in KINDS:
            contexts[kind] = load_context(model, n_ctx=2 * DEPTH, parallel=2, flash_attn="on", cache_type_v=kind)
            L.llama_set_n_threads(contexts[kind].ctx, n_threads, n_threads)
            decode(contexts[kind].ctx, tokens, 0)
        best = dict.fromkeys(KINDS, float("inf"))
        for _ in range(REPEATS):
            for kind, context in contexts.items():
                t0 = time.perf_counter()
                decode(context.ctx, tokens[:1], DEPTH)
                best[kind] = min(best[kind], time.perf_counter() - t0)
                L.llama_memory_seq_rm(L.llama_get_memory(context.ctx), 0, DEPTH, -1)
        return best
    finally:
        L.llama_batch_free(batch)
        for context in contexts.values():
            context.close()


def _file() -> Path:
    from ...core.packages import cache_root

    return cache_root() / "llama-kv-values.json"


def choose(path: Path, model: Any, *, n_gpu_layers: int, n_threads: int | None) -> ValueChoice:
    """f16 or q8_0 for ``model`` (loaded from ``path``), flash attention on, on this CPU."""
    head = value_head(model)
    if head is not None and head % 128 == 0:
        return ValueChoice("f16", f"a value head of {head} elements is summed in whole vector steps on any build")
    file, key = _file(), probe_key(path, n_gpu_layers)
    known = read_verdicts(file).get(key)
    if isinstance(known, dict) and known.get("kind") in KINDS:
        return ValueChoice(known["kind"], f"{known.get('reason', '')} (kept from an earlier start; "
                                          "choose with --cache-type-v)")
    threads = n_threads or len(usable_cpus())
    try:
        # On a thread that ends with the timing. llama.cpp built with OpenMP keeps a pool of worker
        # threads for every thread that decoded with more than one thread, as long as that thread
        # lives; with a second pool in the process (the batch's own thread's) libgomp counts more
        # threads than CPUs and makes every barrier of every decode sleep instead of spin. Timed on
        # the loading thread, which lives on, the server decoded one stream at 17-19 ms a token
        # instead of 9-10 for the rest of its first run (two cores, the embedded model).
        with ThreadPoolExecutor(1, thread_name_prefix="llama.cpp KV value timing") as timing:
            timed = timing.submit(time_decodes, model, threads).result()
    except (RuntimeError, ValueError, OSError, MemoryError) as e:   # (not kept: tried at the next start)
        return ValueChoice("f16", f"the timing of the two could not run ({e})")
    f16_s, q8_s = timed["f16"], timed["q8_0"]
    kind = pick(f16_s, q8_s)
    choice = ValueChoice(kind, f"one token {DEPTH} cells deep decoded in {f16_s * 1000:.1f} ms with f16 values "
                               f"and {q8_s * 1000:.1f} ms with q8_0")
    keep(file, key, {"kind": kind, "reason": choice.reason, "at": int(time.time())})
    return choice

