"""The work a hostile request can cause before it is refused, and how it grows with its size.

Sends, to a server on the embedded model (default context 2048), the worst cases found so far:
  messages   a chat of N messages {"role": "user", "content": "hi"}
  specials   /v1/internal/token-count of "<|im_end|>" x N (a special token per 10 bytes)
  template   /v1/internal/token-count of a whole rendered chat turn x N
each at N, 2N and 4N, and prints the time to the answer and the growth per doubling (2.0 is
linear, 4.0 quadratic). A small chat is sent beside each, and the time it took is printed too:
a hostile request must not hold up the others.

    python bench/bench_bounds.py [--n 25000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
from serving import free_port, start_api, stop, wait_up

SMALL = {"model": "x", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


def cases(n: int) -> dict[str, tuple[str, dict]]:
    return {
        "messages": ("/v1/chat/completions", {"model": "x", "max_tokens": 1,
                                              "messages": [{"role": "user", "content": "hi"}] * (n * 4)}),
        "specials": ("/v1/internal/token-count", {"text": "<|im_end|>" * n}),
        "template": ("/v1/internal/token-count", {"text": "<|im_start|>user\nhi<|im_end|>\n" * (n // 3)}),
    }


async def timed(client: httpx.AsyncClient, path: str, body: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = await client.post(path, json=body)
    return time.perf_counter() - t0, r.status_code


async def run(url: str, n: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await timed(client, "/v1/chat/completions", SMALL)  # warm up
        print(f"{'case':10} {'N':>8} {'bytes':>10} {'status':>6} {'answer s':>9} {'growth':>7} "
              f"{'small chat beside s':>20}")
        for name in cases(n):
            previous = None
            for k in (1, 2, 4):
                path, body = cases(n * k)[name]
                size = len(httpx.Request("POST", "http://x", json=body).content)
                (t, status), (t_small, _) = await asyncio.gather(timed(client, path, body),
                                                                 timed(client, "/v1/chat/completions", SMALL))
                growth = f"{t / previous:.2f}" if previous else "-"
                previous = t
                print(f"{name:10} {n * k:>8} {size:>10} {status:>6} {t:>9.3f} {growth:>7} {t_small:>20.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=25_000)
    args = ap.parse_args()
    port = free_port()
    proc = start_api(port, "--max-body-mb", "64")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base, proc)
        asyncio.run(run(base, args.n))
    finally:
        stop([proc])


if __name__ == "__main__":
    main()
