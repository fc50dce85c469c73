"""What a streamed token's Python costs at one stream, and whether it matters where it runs.

At one stream on a machine with few cores, llama.cpp's threads keep every core busy while they
decode. This measures, on the CPU at hand, what per-token work outside the decode costs in
tokens/s, by the least Python can do and by where a reader's work runs. All in one process, one
context, the main thread, greedy; every mode takes its turn in each round, the order turning:

  bare     the least a Python server can do between two decodes: a ctypes loop (the argmax of
           the logits, the token into the batch, the decode), no reader
  thread   bare, and each token handed to a reader thread that does --work units of Python for
           it (a stand-in for a server's per-token framing and socket write), woken at once: its
           work runs while the next decode runs
  gap      thread, but the loop waits for the reader to finish before it decodes: the reader's
           work runs between two decodes, where llama.cpp's threads are idle
  process  bare, and each token sent to a reader in another process (a pipe): no lock is shared
  llama-server (--llama-server PATH) its own loop's time a token (timings.predicted_per_token_ms
           of a non-streamed completion of the same prompt tokens: decode, sampling and its loop,
           no HTTP a token), back to back with the rest

It prints each mode's ms a token, in llama_decode and outside it, the reader's own CPU a token,
and each mode's tokens/s against bare: the median of the rounds' ratios with a 95% bootstrap
interval.

    python bench/bench_token_cpu.py [--rounds 16] [--tokens 256] [--work 40] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from serving import free_port, wait_up

# A chat chunk as OpenAI streams one token: one unit of --work serializes it once.
CHUNK = {"id": "chatcmpl-0123456789abcdef01234567", "object": "chat.completion.chunk", "created": 1764460800,
         "model": "SmolLM2-135M-Instruct.Q4_1", "system_fingerprint": "fp_local",
         "choices": [{"index": 0, "delta": {"content": " word"}, "logprobs": None, "finish_reason": None}]}
MODES = ("bare", "thread", "gap", "process")


def reader_work(units: int) -> None:
    for _ in range(units):
        json.dumps(CHUNK)


def process_reader(conn: Any, units: int) -> None:
    start = time.process_time()
    count = 0
    while conn.recv() is not None:
        reader_work(units)
        count += 1
    conn.send((time.process_time() - start) / max(count, 1))


class Loop:
    """The bare greedy loop on one llama.cpp context, with a reader of each mode."""

    def __init__(self, rt: Any, units: int, tokens: int):
        from openai_ext.hosts.llamacpp.plan import write

        self.rt, self.units, self.tokens, self.write = rt, units, tokens, write
        self.batch = rt.L.llama_batch_init(512, 0, 1)
        self.mem = rt.L.llama_get_memory(rt.ctx)

    def close(self) -> None:
        self.rt.L.llama_batch_free(self.batch)

    def run(self, prompt: list[int], mode: str) -> tuple[float, float, float]:
        """(ms a token, ms of it in llama_decode, the reader's CPU ms a token)."""
        L, ctx, rt = self.rt.L, self.rt.ctx, self.rt
        L.llama_memory_clear(self.mem, True)
        self.write(self.batch, [(0, prompt, 0, len(prompt) - 1)])
        L.llama_decode(ctx, self.batch)
        handed = threading.Condition()
        queue: list[int | None] = []
        finished = threading.Event()
        spent = [0.0, 0]

        def reader() -> None:
            start = time.thread_time()
            while True:
                with handed:
                    while not queue:
                        handed.wait()
                    item = queue.pop()
                if item is None:
                    break
                reader_work(self.units)
                spent[1] += 1
                finished.set()
            spent[0] = time.thread_time() - start

        worker = threading.Thread(target=reader) if mode in ("thread", "gap") else None
        if worker is not None:
            worker.start()
        if mode == "process":
            conn, child = multiprocessing.Pipe()
            proc = multiprocessing.get_context("fork").Process(target=process_reader, args=(child, self.units))
            proc.start()
        out, pos, decoding = 0, len(prompt), 0.0
        started = time.perf_counter()
        while out < self.tokens:
            token = int(rt.logits(-1).argmax())
            if rt.eog[token]:
                break
            out += 1
            if worker is not None:
                finished.clear()
                with handed:
                    queue.append(token)
                    handed.notify()
                if mode == "gap":
                    finished.wait(0.01)
            elif mode == "process":
                conn.send(token)
            self.write(self.batch, [(0, [token], pos, 0)])
            pos += 1
            t = time.perf_counter()
            L.llama_decode(ctx, self.batch)
            decoding += time.perf_counter() - t
        wall = time.perf_counter() - started
        reader_ms = 0.0
        if worker is not None:
            with handed:
                queue.append(None)
                handed.notify()
            worker.join()
            reader_ms = spent[0] * 1000 / max(spent[1], 1)
        elif mode == "process":
            conn.send(None)
            reader_ms = conn.recv() * 1000
            proc.join()
        return wall * 1000 / max(out, 1), decoding * 1000 / max(out, 1), reader_ms


def llama_server_ms(client: httpx.Client, base: str, prompt: list[int], tokens: int) -> float:
    reply = client.post(f"{base}/completion", json={"prompt": prompt, "n_predict": tokens, "temperature": 0,
                                                      "cache_prompt": False}).json()
    return float(reply["timings"]["predicted_per_token_ms"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--work", type=int, default=40, help="units of reader work a token (one chunk serialized each)")
    ap.add_argument("--llama-server", help="llama-server binary: its own loop's time a token, beside")
    ap.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    args = ap.parse_args()
    import numpy as np
    from bench_speed import start_llama_server

    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.hosts.llamacpp.context import Runtime

    model = Path(args.model or default_gguf())
    # The host makes the prompts and chooses what its context would use; the loop gets a context
    # of its own with the same choices (one context in the process: the host is closed first).
    host = LlamaCppHost(str(model), n_ctx=32768, parallel=8, speculation="off")
    prompts = [host.tokenize(host.chat_prompt([{"role": "user", "content": f"Story {i}: write a very long "
                                                "story about a lighthouse keeper and the sea."}]).text)
               for i in range(5)]
    kind, extra = host.runtime.cache_type_v, host.buffers.extra_buffers
    gen, batch = host.threads.gen, host.threads.batch
    host.close()
    rt = Runtime(model, extra_buffers=extra, n_gpu_layers=0, n_ctx=32768, parallel=8, n_threads=None,
                 flash_attn="auto", cache_type_v=kind)
    rt.L.llama_set_n_threads(rt.ctx, gen, batch)
    loop = Loop(rt, args.work, args.tokens)
    modes = list(MODES) + (["llama-server"] if args.llama_server else [])
    server, client, base = None, httpx.Client(timeout=300), ""
    results: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    try:
        if args.llama_server:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            server = start_llama_server(args.llama_server, port, str(model), 32768, extra)
            wait_up(base, server, path="/health")
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            if (r // len(modes)) % 2:
                order.reverse()
            prompt = prompts[r % len(prompts)]
            for mode in order:
                if mode == "llama-server":
                    results[mode].append((llama_server_ms(client, base, prompt, args.tokens), 0.0, 0.0))
                else:
                    results[mode].append(loop.run(prompt, mode))
    finally:
        loop.close()
        rt.close()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    rng = np.random.default_rng(0)
    print(f"\none stream, {args.rounds} rounds of {args.tokens} tokens, greedy, {gen} threads; reader work "
          f"{args.work} units a token")
    print("mode           ms/token  in decode  outside (us)  reader CPU/token (us)  tokens/s vs bare (95% interval)")
    for mode, runs in results.items():
        ms = statistics.median(w for w, _, _ in runs)
        line = f"{mode:13}  {ms:8.3f}"
        if mode != "llama-server":
            line += (f"  {statistics.median(d for _, d, _ in runs):9.3f}  "
                     f"{statistics.median(w - d for w, d, _ in runs) * 1000:12.0f}  "
                     f"{statistics.median(c for _, _, c in runs) * 1000:21.0f}")
        else:
            line += f"  {'':9}  {'':12}  {'':21}"
        if mode != "bare":
            ratios = np.array([b[0] / x[0] for x, b in zip(runs, results["bare"], strict=True)])
            low, high = np.percentile(np.median(rng.choice(ratios, (2000, len(ratios))), axis=1), [2.5, 97.5])
            line += f"  {np.median(ratios):.3f} ({low:.3f}-{high:.3f})"
        print(line)


if __name__ == "__main__":
    main()
