"""Where a generated token's time goes in the embedded host: llama.cpp's decode, and the Python
around it (planning the step, filling the batch, sampling, detokenizing, handing pieces to the
reader), at N = 1 and N = 8 streams, shallow and deep into the context, with the KV values kept
as f16 (as before cache_type_v) and as q8_0 (its default where flash attention runs on the CPU).

Every configuration runs in one process, one after the other, in each round (so drift hits all
alike); the figures are medians of the rounds.

    python bench/bench_step.py [--rounds 3] [--tokens 96] [--depth 2400] [--model PATH]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import serving  # noqa: F401 - puts the project on the path, as for every benchmark


def measure(host, n: int, depth: int, tokens: int, round_: int) -> tuple[float, float]:
    """Milliseconds per generated token (wall, all streams together) and the share of it spent
    inside llama_decode."""
    from openai_ext.hosts.base import Prompt
    from openai_ext.hosts.request import GenerationSettings

    L = host.runtime.L
    decode = L.llama_decode
    spent = [0.0]

    def timed(ctx, batch):
        t = time.perf_counter()
        try:
            return decode(ctx, batch)
        finally:
            spent[0] += time.perf_counter() - t

    words = ["river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "engine"]
    prompts = []
    for k in range(n):
        filler = " ".join(f"{words[(i + k + round_) % 8]}{i % 89}" for i in range(depth // 3))
        text = host.chat_prompt([{"role": "user", "content": f"{filler}\nStream {k}.{round_}: tell a story."}]).text
        prompts.append(Prompt(text, host.tokenize(text)))
    settings = GenerationSettings(max_new_tokens=tokens, temperature=0.0, samplers={"ban_eos_token": True})
    first = threading.Barrier(n + 1)

    def run(prompt):
        it = iter(host.generate(prompt, settings, threading.Event()))
        next(it)   # the prompt is read: time from here on
        first.wait()
        for _ in it:
            pass

    def generated() -> int:
        stats = host.batch_stats()
        return stats["decoded"] - stats["prompt_tokens"]

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(run, p) for p in prompts]
        first.wait()
        L.llama_decode = timed
        t0, before = time.perf_counter(), generated()
        for f in futures:
            f.result()
        wall = time.perf_counter() - t0
        L.llama_decode = decode
    return wall * 1000 / (generated() - before), spent[0] / wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--depth", type=int, default=2400)
    ap.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    args = ap.parse_args()
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.hosts.llamacpp.batch import Scheduler

    # Each host's decoding thread ends soon after its turn (with its OpenMP pool: with both pools
    # alive, every decode's barriers sleep; llamacpp/batch.Scheduler.IDLE_EXIT), before the other's.
    Scheduler.IDLE_EXIT = 0.05
    model = args.model or str(default_gguf())
    hosts = {kind: LlamaCppHost(model, n_ctx=32768, parallel=8, speculation="off", cache_type_v=kind)
             for kind in ("f16", "q8_0")}
    results: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    try:
        for r in range(args.rounds):
            for n in (1, 8):
                for depth in (0, args.depth):
                    for kind, host in hosts.items():
                        time.sleep(0.5)   # (the other host's thread has ended)
                        results.setdefault((kind, n, depth), []).append(measure(host, n, depth, args.tokens, r))
    finally:
        for host in hosts.values():
            host.close()
    print(f"\n{args.rounds} rounds, {args.tokens} tokens a stream, flash attention on (parallel 8), greedy")
    print("streams  depth   values  ms/token  in llama_decode  Python around it  (x f16)")
    for (kind, n, depth), runs in results.items():
        ms = statistics.median(m for m, _ in runs)
        share = statistics.median(s for _, s in runs)
        base = statistics.median(m for m, _ in results[("f16", n, depth)])
        print(f"{n:7d} {depth:6d}  {kind:>6}  {ms:8.2f}  {ms * share:15.2f}  {ms * (1 - share):16.2f}  "
              f"({ms / base:.2f}x)")


if __name__ == "__main__":
    main()
