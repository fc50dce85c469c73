"""The Batch API against the same requests sent live, on the embedded model, in one run.

  throughput   N chat requests (--requests, 200 by default; --max-tokens each, greedy) sent live
               by --parallel clients at once, then the same requests as one batch: each one's
               completed requests per second, and the batch's as a ratio of live (goal >= 0.95).
  latency      short streamed chats sent one after another: the p50/p95 time to first token on a
               quiet server, then while a batch of the same N requests runs (goal: p95 <= 1.5x), and
               beside the same requests sent live by as many clients as the batch has lanes.

    python bench/bench_batches.py [--requests 200] [--max-tokens 24] [--parallel 8] [--probes 20] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import tempfile
import time

import httpx
from bench_concurrency import one_stream, pct
from openai import OpenAI
from serving import free_port, start_api, stop, wait_up

TOPICS = ["the sea", "a mountain", "a city", "a forest", "the moon", "a river", "a desert", "an island"]


def request(i: int, max_tokens: int) -> dict:
    return {"model": "x", "messages": [{"role": "user", "content": f"Write one sentence about {TOPICS[i % 8]} ({i})."}],
            "max_tokens": max_tokens, "temperature": 0}


async def live(base: str, n: int, max_tokens: int, parallel: int) -> float:
    """Seconds to answer n requests with ``parallel`` clients, each sending its next when answered."""
    todo = list(range(n))
    async with httpx.AsyncClient(timeout=600) as client:
        async def worker() -> None:
            while todo:
                i = todo.pop()
                r = await client.post(f"{base}/chat/completions", json=request(i, max_tokens))
                r.raise_for_status()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(parallel)))
    return time.perf_counter() - t0


def start_batch(client: OpenAI, n: int, max_tokens: int) -> str:
    lines = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": request(i, max_tokens)}) + "\n" for i in range(n))
    file = client.files.create(file=("requests.jsonl", io.BytesIO(lines.encode())), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h").id


def wait_batch(client: OpenAI, batch_id: str) -> None:
    while (b := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.2)
    if b.status != "completed" or b.request_counts.failed:
        raise SystemExit(f"the batch ended {b.status} with {b.request_counts}")


async def probes(base: str, k: int, stop_when=None) -> list[float]:
    """Times to first token of ``k`` short streamed chats, one after another."""
    out = []
    async with httpx.AsyncClient(timeout=600) as client:
        for i in range(k):
            if stop_when is not None and stop_when():
                break
            ttft, *_ = await one_stream(client, base, "x", [{"role": "user", "content": f"Say hello ({i})."}], 8)
            out.append(ttft)
    return out


async def beside_live(base: str, args: argparse.Namespace) -> list[float]:
    """The probes beside the same requests sent live by as many clients as the batch has lanes."""
    load = asyncio.ensure_future(live(base, args.requests, args.max_tokens, args.parallel - 1))
    await asyncio.sleep(1.0)
    out = await probes(base, args.probes, load.done)
    await load
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    port = free_port()
    ratios, rates = [], {"live": [], "batch": []}
    quiet, busy, crowded = [], [], []
    with tempfile.TemporaryDirectory() as data:
        proc = start_api(port, "--parallel", str(args.parallel), "--data-dir", data)
        base = f"http://127.0.0.1:{port}/v1"
        try:
            wait_up(base, proc)
            client = OpenAI(base_url=base, api_key="none", max_retries=0)
            asyncio.run(live(base, 16, args.max_tokens, args.parallel))   # warm up
            for r in range(args.rounds):
                took = {}
                for way in (("live", "batch") if r % 2 == 0 else ("batch", "live")):   # drift hits both alike
                    t0 = time.perf_counter()
                    if way == "live":
                        asyncio.run(live(base, args.requests, args.max_tokens, args.parallel))
                    else:
                        wait_batch(client, start_batch(client, args.requests, args.max_tokens))
                    took[way] = time.perf_counter() - t0
                    rates[way].append(args.requests / took[way])
                ratios.append(took["live"] / took["batch"])
                quiet += asyncio.run(probes(base, args.probes))
                batch_id = start_batch(client, args.requests, args.max_tokens)
                time.sleep(1.0)   # the batch under way
                ended = lambda b=batch_id: client.batches.retrieve(b).status != "in_progress"  # noqa: E731
                busy += asyncio.run(probes(base, args.probes, ended))
                wait_batch(client, batch_id)
                crowded += asyncio.run(beside_live(base, args))
        finally:
            stop([proc])
    print(f"throughput ({args.requests} requests, {args.max_tokens} tokens, parallel {args.parallel}, "
          f"{args.rounds} rounds, medians):")
    print(f"  live   {statistics.median(rates['live']):6.2f} requests/s")
    print(f"  batch  {statistics.median(rates['batch']):6.2f} requests/s   x{statistics.median(ratios):.2f} of live "
          f"(each round: {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"latency (time to first token of short chats: {len(quiet)} quiet, {len(busy)} beside the batch, "
          f"{len(crowded)} beside the same requests live):")
    for name, values in (("quiet", quiet), ("with batch", busy), ("with live", crowded)):
        print(f"  {name:<12} p50 {pct(values, 0.5) * 1000:6.0f} ms  p95 {pct(values, 0.95) * 1000:6.0f} ms   "
              f"x{pct(values, 0.95) / pct(quiet, 0.95):.2f}")


if __name__ == "__main__":
    main()
