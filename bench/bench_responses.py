"""Streamed /v1/responses vs streamed /v1/chat/completions, side by side in one run.

The same server process, the same prompts, greedy decoding: both routes produce the same tokens,
so what differs is what each API adds around the generation (the Responses API prepares a stored
response, writes it to its database before and after, and sends named semantic events). Runs
alternate between the two (and which goes first) so drift on a shared machine hits both alike.

Measures time to first token (TTFT: request sent -> first text delta) and decode speed (tokens/s
after the first text delta), and prints the Responses route as a difference (TTFT, ms) and a
ratio (decode) of chat's, paired run by run.

    python bench/bench_responses.py [--rounds 5] [--max-tokens 200] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import httpx
from serving import PROMPTS, free_port, start_api, stop, stream_chat, wait_up


def responses(client: httpx.Client, base: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    body = {"model": "local", "input": prompt, "max_output_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first = last = None
    n = 0
    with client.stream("POST", f"{base}/responses", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"/v1/responses answered {r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta" and event["delta"]:
                first = first or now
                last = now
            elif event["type"] in ("response.completed", "response.incomplete"):
                n = event["response"]["usage"]["output_tokens"]
    return first - t0, (n - 1) / (last - first), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    args = ap.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    data = tempfile.TemporaryDirectory()
    flags = ["--n-ctx", str(args.n_ctx), "--data-dir", data.name] + (["--model", args.model] if args.model else [])
    proc = start_api(port, *flags)
    results: dict[str, list[tuple[float, float, int]]] = {"chat": [], "responses": []}
    contenders = {"chat": lambda c, b, p, m: stream_chat(c, f"{b}/chat/completions", p, m), "responses": responses}
    try:
        wait_up(base, proc)
        client = httpx.Client(timeout=300)
        for fn in contenders.values():   # warm-up: templates, the database, the first-use paths
            fn(client, base, "Hello", 16)   # 16: the least max_output_tokens OpenAI allows
        for r in range(args.rounds):
            for p, prompt in enumerate(PROMPTS):
                order = list(contenders) if (r + p) % 2 == 0 else list(contenders)[::-1]
                for name in order:
                    results[name].append(contenders[name](client, base, prompt, args.max_tokens))
    finally:
        stop([proc])
        data.cleanup()

    print(f"{args.rounds} rounds x {len(PROMPTS)} prompts, up to {args.max_tokens} tokens, greedy, one server")
    print(f"\n{'route':12} {'TTFT ms':>9} {'decode tok/s':>13} {'tokens':>7}")
    for name, rows in results.items():
        print(f"{name:12} {statistics.median(x[0] for x in rows) * 1000:9.1f} "
              f"{statistics.median(x[1] for x in rows):13.1f} {statistics.median(x[2] for x in rows):7.0f}")
    pairs = list(zip(results["responses"], results["chat"], strict=False))
    assert all(a[2] == b[2] for a, b in pairs), "the two routes generated different token counts"
    extra = [(a[0] - b[0]) * 1000 for a, b in pairs]
    ratio = [a[1] / b[1] for a, b in pairs]
    print(f"\nresponses vs chat: TTFT {statistics.median(extra):+.2f} ms (quartiles "
          f"{statistics.quantiles(extra, n=4)[0]:+.2f} / {statistics.quantiles(extra, n=4)[2]:+.2f}), "
          f"decode {statistics.median(ratio):.3f}x (quartiles {statistics.quantiles(ratio, n=4)[0]:.3f} / "
          f"{statistics.quantiles(ratio, n=4)[2]:.3f})")
    print("(medians of per-run differences and ratios, each Responses run paired with the chat run of the\n"
          " same prompt in the same round)")


if __name__ == "__main__":
    main()
