"""Streamed /v1/messages vs streamed /v1/chat/completions, side by side in one run.

Both go to the same server process (python -m openai_ext) and the same model, with greedy
decoding, so both generate the same tokens; what differs is the API layer: the translation into
a chat request, Anthropic's content blocks and its named events. Measures time to first token
(TTFT: from sending the request to the first text delta) and decode speed (tokens/s after the
first token), and prints Messages as a ratio of chat, each run paired with the chat run of the
same prompt in the same round, so drift on a shared machine cancels. Runs alternate, and which
API goes first alternates from prompt to prompt.

    python bench/bench_messages.py [--rounds 5] [--max-tokens 200] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx
from serving import PROMPTS, free_port, start_api, stop, stream_chat, wait_up

Run = tuple[float, float, int]   # TTFT seconds, decode tokens/s, tokens


def messages(client: httpx.Client, base: str, prompt: str, max_tokens: int) -> Run:
    body = {"model": "local", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    with client.stream("POST", f"{base}/v1/messages", json=body,
                       headers={"anthropic-version": "2023-06-01"}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            if event["type"] == "content_block_delta" and event["delta"].get("text"):
                first = first or now
                last = now
            elif event["type"] == "message_delta":
                tokens = event["usage"]["output_tokens"]
    return first - t0, (tokens - 1) / (last - first), tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    args = ap.parse_args()

    from openai_ext.hosts.files import default_gguf

    model = str(args.model or default_gguf())
    port = free_port()
    proc = start_api(port, "--model", model, "--n-ctx", str(args.n_ctx))
    base = f"http://127.0.0.1:{port}"
    print(f"model {Path(model).name}, n_ctx {args.n_ctx}, {args.rounds} rounds x {len(PROMPTS)} prompts, "
          f"up to {args.max_tokens} tokens, greedy, one server")
    contenders = {"chat/completions": lambda c, b, p, m: stream_chat(c, f"{b}/v1/chat/completions", p, m),
                  "messages": messages}
    results: dict[str, list[Run]] = {name: [] for name in contenders}
    try:
        wait_up(f"{base}/v1", proc)
        client = httpx.Client(timeout=300)
        for fn in contenders.values():   # warm-up: load pages, compile templates
            fn(client, base, "Hello", 8)
        for r in range(args.rounds):
            for i, prompt in enumerate(PROMPTS):
                order = list(contenders.items())
                if (r + i) % 2:
                    order.reverse()
                for name, fn in order:
                    results[name].append(fn(client, base, prompt, args.max_tokens))
    finally:
        stop([proc])

    ref = results["chat/completions"]
    mismatched = sum(a[2] != b[2] for a, b in zip(results["messages"], ref, strict=False))
    print(f"\n{'API':18} {'TTFT ms':>9} {'decode tok/s':>13} {'tokens':>7} {'TTFT +ms':>9} {'decode ratio':>13}")
    for name, rows in results.items():
        ttft = statistics.median(r[0] for r in rows)
        tps = statistics.median(r[1] for r in rows)
        toks = statistics.median(r[2] for r in rows)
        extra = statistics.median((r[0] - b[0]) * 1000 for r, b in zip(rows, ref, strict=False))
        ratio = statistics.median(r[1] / b[1] for r, b in zip(rows, ref, strict=False))
        print(f"{name:18} {ttft * 1000:9.1f} {tps:13.1f} {toks:7.0f} {extra:+9.1f} {ratio:12.3f}x")
    print("\n(medians over runs; TTFT +ms and decode ratio are medians of per-run differences and ratios\n"
          " against the chat run of the same prompt in the same round; target: decode >= 0.97x, TTFT <= +2 ms)")
    if mismatched:
        print(f"warning: {mismatched} runs generated a different number of tokens than their chat pair")


if __name__ == "__main__":
    main()
