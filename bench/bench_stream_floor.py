"""The event loop's CPU per streamed token: this server's against the least uvicorn can do.

At one stream on a machine with few cores, every microsecond the server's event loop spends on a
token is taken from llama.cpp's threads, which keep every core busy while they decode. This
measures that cost side by side with its floor: a bare ASGI app under the same uvicorn (uvloop,
httptools) that streams a chunk of the same size per token, handed over from a thread at this
server's own pace, which is the least any Python server on this stack can spend. The difference
is what this server's own layers cost (the request's chunk, its framing, the outbox); the floor
is what only leaving Python for the per-token path could cut.

CPU is the event loop thread's own, read from /proc (Linux only): the main thread of each process.
Each round streams from both, in alternating order; the figures are medians of the rounds.

    python bench/bench_stream_floor.py [--rounds 4] [--streams 4] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time

import httpx
from serving import PROMPTS, free_port, start_api, start_server, stop, stream_chat, wait_up

# A chunk as OpenAI streams one token (this server's chunks are this size, give or take the text).
CHUNK = {"id": "chatcmpl-0123456789abcdef01234567", "object": "chat.completion.chunk", "created": 1764460800,
         "model": "SmolLM2-135M-Instruct.Q4_1", "system_fingerprint": "fp_local",
         "choices": [{"index": 0, "delta": {"content": " word"}, "logprobs": None, "finish_reason": None}]}


async def bare_app(scope, receive, send) -> None:
    """Streams ``max_tokens`` chunks, one every ``pace`` seconds, handed from a thread to the event
    loop as a generation's pieces are (one wake-up a piece)."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body or b"{}")
    count, pace = int(request.get("max_tokens", 16)), float(request.get("pace", 0.01))
    loop = asyncio.get_running_loop()
    ready: list[int] = []
    waiter: list[asyncio.Future | None] = [None]
    lock = threading.Lock()

    def produce() -> None:
        for i in range(count):
            time.sleep(pace)
            with lock:
                ready.append(i)
                future, waiter[0] = waiter[0], None
            if future is not None:
                loop.call_soon_threadsafe(lambda f=future: f.done() or f.set_result(None))

    threading.Thread(target=produce, daemon=True).start()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    sent = 0
    while sent < count:
        with lock:
            future = None
            if ready:
                ready.pop()
            else:
                future = waiter[0] = loop.create_future()
        if future is not None:
            await future
            continue
        sent += 1
        chunk = b"data: " + json.dumps(CHUNK).encode() + b"\n\n"
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def thread_cpu(pid: int) -> float:
    """Seconds the process's main thread has run (/proc's scheduler statistics, in ns)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def ours(base: str, streams: int, max_tokens: int) -> tuple[int, float]:
    """Tokens streamed one stream after another, and their decode pace (s a token)."""
    tokens, seconds = 0, 0.0
    with httpx.Client(timeout=300) as client:
        for k in range(streams):
            _, tps, n = stream_chat(client, base + "/chat/completions", PROMPTS[k % len(PROMPTS)], max_tokens)
            tokens += n
            seconds += n / tps if tps else 0.0
    return tokens, seconds / max(tokens, 1)


def bare(base: str, tokens: int, pace: float) -> int:
    with httpx.Client(timeout=300) as client:
        with client.stream("POST", base + "/chat/completions", json={"max_tokens": tokens, "pace": pace}) as r:
            return sum(1 for line in r.iter_lines() if line.startswith("data: {"))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--bare":
        import uvicorn
        uvicorn.run(bare_app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--streams", type=int, default=4, help="streams a round, one after another")
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    api_port, bare_port = free_port(), free_port()
    api = start_api(api_port, "--parallel", "1")
    floor = start_server([os.path.abspath(__file__), "--bare", str(bare_port)])
    procs = [api, floor]
    try:
        api_base, bare_base = f"http://127.0.0.1:{api_port}/v1", f"http://127.0.0.1:{bare_port}/v1"
        wait_up(api_base, api)
        wait_up(bare_base, floor)   # (the bare app answers any path, /models too, with a short stream)
        ours(api_base, 1, 16)   # warm-up
        mine, least, paces = [], [], []
        for r in range(args.rounds):
            order = ["api", "bare"] if r % 2 == 0 else ["bare", "api"]
            pace = statistics.median(paces) if paces else 0.01
            for who in order:
                if who == "api":
                    before = thread_cpu(api.pid)
                    got, pace = ours(api_base, args.streams, args.max_tokens)
                    mine.append((thread_cpu(api.pid) - before) / got)
                    paces.append(pace)
                else:
                    before = thread_cpu(floor.pid)
                    got = bare(bare_base, args.streams * args.max_tokens, pace)
                    least.append((thread_cpu(floor.pid) - before) / got)
        m, f, p = statistics.median(mine), statistics.median(least), statistics.median(paces)
        print(f"event loop CPU per streamed token, {args.rounds} rounds of {args.streams} x {args.max_tokens} tokens "
              f"(one stream at a time, {os.cpu_count()} CPUs)")
        print(f"  this server          {m * 1e3:6.3f} ms  ({m / p:.1%} of a token at its pace of {p * 1e3:.2f} ms)")
        print(f"  bare uvicorn floor   {f * 1e3:6.3f} ms  ({f / p:.1%} of a token)")
        print(f"  this server's layers {(m - f) * 1e3:6.3f} ms  ({m / f:.2f}x the floor)")
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
