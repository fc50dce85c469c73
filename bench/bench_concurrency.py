"""Many clients at once: this server with parallel=1 against parallel=P, side by side in one run.

For N = 1, 2, 4, 8 concurrent streaming clients (each a different prompt, 128 tokens, temperature
0) it measures the aggregate completion tokens per second (all clients' tokens over the wall time
from the first request to the last end) and the p50/p95 time to first token over every client of
every round. Contenders take turns within each round, so drift on a shared machine hits all alike:

  parallel=1   python -m openai_ext --parallel 1 (one generation at a time, as before batching)
  parallel=P   python -m openai_ext --parallel P (P = --parallel, default the largest N)
  others       any OpenAI-compatible servers given with --other NAME=URL (llama.cpp's llama-server
               with --parallel 8 on the same GGUF, say, or this project at an earlier commit)

With --hog H, every round runs twice: as above, then with H busy processes beside the servers
(each a Python loop that never sleeps, as a build or another service would be), and the tables
show how each server degrades. A server that keeps a fair share of the CPU keeps at least
(CPUs - H) / CPUs of its throughput.

Then prefix reuse: a ten-turn conversation on the parallel=P server (each turn sends the whole
history plus a new question); the time to first token of the tenth turn against the first, and
against the same tenth-turn prompt made cold (a different first line, so no cached prefix fits).

    python bench/bench_concurrency.py [--rounds 3] [--clients 1,2,4,8] [--parallel 8]
        [--other llama-server=http://127.0.0.1:8080/v1 ...] [--model PATH] [--n-ctx 8192] [--hog H]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import httpx
from serving import free_port, start_api, stop, wait_up

TOPICS = [
    "a dragon who learns to bake bread", "a lighthouse keeper and a storm", "a robot exploring an old library",
    "two friends crossing a desert", "a cat who becomes a sailor", "a village that forgot how to sing",
    "a clockmaker who can stop time", "a whale that collects lost songs", "a girl who maps the stars",
    "a bridge that talks to travellers", "a gardener on the moon", "a detective who is a crow",
]


def prompt(i: int, round_: int) -> str:
    return f"Write a long story about {TOPICS[(i + round_ * 5) % len(TOPICS)]}. (Story {round_}-{i}.)"


async def one_stream(client: httpx.AsyncClient, base: str, model: str, messages: list[dict],
                     max_tokens: int) -> tuple[float, int, float, str]:
    """(time to first token, completion tokens, end time, text) of one streamed chat request."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    usage = None
    chunks, text = 0, []
    async with client.stream("POST", f"{base}/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"{base}: HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            if delta.get("content"):
                first = first or time.perf_counter()
                chunks += 1
                text.append(delta["content"])
    # a server that ignores include_usage sends one chunk per token
    n = usage["completion_tokens"] if usage else chunks
    return (first or time.perf_counter()) - t0, n, time.perf_counter(), "".join(text)


async def crowd(base: str, model: str, n: int, round_: int, max_tokens: int) -> tuple[float, list[float]]:
    """N clients at once: (aggregate tokens/s, their times to first token)."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        t0 = time.perf_counter()
        runs = await asyncio.gather(*(one_stream(client, base, model, [{"role": "user", "content": prompt(i, round_)}],
                                                 max_tokens) for i in range(n)))
    wall = max(r[2] for r in runs) - t0
    return sum(r[1] for r in runs) / wall, [r[0] for r in runs]


QUESTIONS = ["What is the capital of France?", "And of Italy?", "Name a river there.", "How long is it?",
             "Which sea does it reach?", "Name a fish of that sea.", "What does it eat?", "Where does it spawn?",
             "Is it endangered?", "Summarise our talk in one line."]


async def conversation(base: str, model: str, turns: int = 10) -> tuple[list[float], float]:
    """Times to first token of each turn of one conversation, and of the last turn sent cold."""
    system = {"role": "system", "content": "You are a patient geography teacher. " * 8}
    messages = [system]
    ttfts = []
    async with httpx.AsyncClient(timeout=600) as client:
        for q in QUESTIONS[:turns]:
            messages.append({"role": "user", "content": q})
            ttft, _, _, answer = await one_stream(client, base, model, messages, 48)
            ttfts.append(ttft)
            messages.append({"role": "assistant", "content": answer})
        cold = [{"role": "system", "content": f"Session {time.time_ns()}. " + system["content"]}] + messages[1:-1]
        cold_ttft, *_ = await one_stream(client, base, model, cold, 48)
    return ttfts, cold_ttft


@contextlib.contextmanager
def hogs(n: int):
    """``n`` processes that keep a CPU busy each, for as long as the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--parallel", type=int, default=0, help="sequences of the batched server (default: the largest N)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--other", action="append", default=[], metavar="NAME=URL",
                    help="another OpenAI-compatible server, e.g. llama-server=http://127.0.0.1:8080/v1 (repeatable)")
    ap.add_argument("--skip-serial", action="store_true", help="leave out the parallel=1 server")
    ap.add_argument("--hog", type=int, default=0, metavar="H",
                    help="also run every round with H busy processes beside the servers")
    ap.add_argument("--skip-turns", action="store_true", help="leave out the ten-turn conversation")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    parallel = args.parallel or max(counts)

    flags = ["--n-ctx", str(args.n_ctx)] + (["--model", args.model] if args.model else [])
    servers: dict[str, str] = {}
    procs = []
    configs = ([] if args.skip_serial else [1]) + [parallel]
    for p in configs:
        port = free_port()
        procs.append(start_api(port, *flags, "--parallel", str(p), "--max-queue", "64"))
        servers[f"parallel={p}"] = f"http://127.0.0.1:{port}/v1"
    for other in args.other:
        name, _, url = other.partition("=")
        servers[name] = url.rstrip("/")
    models = {name: "local" for name in servers}
    rows: dict[tuple[str, int, int], list[tuple[float, list[float]]]] = {}
    loads = [0, args.hog] if args.hog else [0]
    try:
        for base, proc in zip(servers.values(), procs, strict=False):
            wait_up(base, proc)
        for name, base in servers.items():   # warm-up: pages loaded, templates compiled
            asyncio.run(crowd(base, models[name], 2, 99, 8))
        print(f"{len(servers)} servers, clients {counts}, {args.max_tokens} tokens each, temperature 0, "
              f"{args.rounds} rounds, n_ctx {args.n_ctx}, {os.cpu_count()} CPUs"
              + (f", busy processes beside them: 0 and {args.hog}" if args.hog else ""))
        for r in range(args.rounds):
            for hog in loads:
                with hogs(hog):
                    for n in counts:
                        for name, base in servers.items():
                            rows.setdefault((name, hog, n), []).append(
                                asyncio.run(crowd(base, models[name], n, r, args.max_tokens)))
            print(f"round {r + 1} done", flush=True)
        turns = {} if args.skip_turns else {name: asyncio.run(conversation(servers[name], models[name]))
                                            for name in servers if name != "parallel=1"}
    finally:
        stop(procs)

    print(f"\n{'server':16} {'hog':>3} {'N':>3} {'agg tok/s':>10} {'p50 TTFT ms':>12} {'p95 TTFT ms':>12}")
    table: dict[tuple[str, int, int], tuple[float, float, float]] = {}
    for (name, hog, n), runs in rows.items():
        tps = statistics.median(r[0] for r in runs)
        ttfts = [t for r in runs for t in r[1]]
        table[name, hog, n] = (tps, pct(ttfts, 0.5) * 1000, pct(ttfts, 0.95) * 1000)
    for name in servers:
        for hog in loads:
            for n in counts:
                tps, p50, p95 = table[name, hog, n]
                print(f"{name:16} {hog:3d} {n:3d} {tps:10.1f} {p50:12.1f} {p95:12.1f}")
    batched = f"parallel={parallel}"
    for hog in loads:
        for ref in [s for s in servers if s != batched]:
            print(f"\n{batched} / {ref}" + (f" (with {hog} busy processes)" if hog else "") + ":")
            for n in counts:
                (a, _, pa), (b, _, pb) = table[batched, hog, n], table[ref, hog, n]
                print(f"  N={n}: aggregate tok/s x{a / b:.2f}, p95 TTFT x{pa / pb:.2f}")
    if args.hog:
        cpus = os.cpu_count() or 1
        print(f"\nwith {args.hog} busy processes / without (a fair share keeps x{max(cpus - args.hog, 1) / cpus:.2f}):")
        for name in servers:
            print(f"  {name:16} " + ", ".join(
                f"N={n}: tok/s x{table[name, args.hog, n][0] / table[name, 0, n][0]:.2f} "
                f"p95 TTFT x{table[name, args.hog, n][2] / table[name, 0, n][2]:.2f}" for n in counts))
    one, most = table[batched, 0, counts[0]][0], table[batched, 0, counts[-1]][0]
    print(f"\n{batched}: aggregate at N={counts[-1]} is x{most / one:.2f} its N={counts[0]} figure")
    for name, (ttfts, cold) in turns.items():
        print(f"\nprefix reuse on {name}: TTFT turn 1 {ttfts[0] * 1000:.1f} ms, turn 10 {ttfts[-1] * 1000:.1f} ms "
              f"(x{ttfts[-1] / ttfts[0]:.2f}); turn 10 cold {cold * 1000:.1f} ms")
        print("  every turn (ms): " + " ".join(f"{t * 1000:.0f}" for t in ttfts))


if __name__ == "__main__":
    main()
