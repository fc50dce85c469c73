"""This server against llama.cpp's llama-server on the same GGUF, side by side in one run.

Three workloads, every contender taking its turn within each round (so drift on a shared machine
hits all alike), all greedy:

  streams    N = 1 and N = 8 streaming chats at once (128 tokens each): aggregate tokens/s and
             the p95 time to first token.
  fairness   four long prompts (--long-tokens, 6,000 by default) sent at once, and while they are
             read, short chats (8 tokens) one after another: the p50/p95/max time to first token of
             the short chats.
  pairs      (not by default; --pairs N) one stream, N turns: in each, the same request to this
             server, to it with speculation off and to llama-server, back to back, the order
             turning each time; against llama-server (or, without it, speculation off), the median of
             the pairs' tokens/s ratios with its 95% bootstrap interval, and the times to first
             token. On a VM whose speed drifts 10-15% from minute to minute, the ratio of two
             requests a second apart keeps little of the drift, where medians of rounds keep it.
  editing    rewrite a 300-line file with one change, the model repeating most of what it was given:
             generated tokens/s, with speculation on and off (this server: prompt lookup;
             llama-server: its n-gram speculation, --spec-type ngram-simple at its defaults). The
             file is code no model has seen (see source_file), and the report says whether every
             server gave the same reply: a speed compared over different replies compares the
             replies.

The servers: this server (default settings, --parallel 8), this server with --speculation off,
llama-server --parallel 8 -kvu (with --no-repack where this server's CPU test turned the extra CPU
buffer types off, as on a CPU that reports AMX), and llama-server with n-gram speculation. Every
server gets the same context.
Without --llama-server, this server's two alone (ratios then against this server).

    python bench/bench_speed.py [--llama-server PATH] [--rounds 2] [--n-ctx 32768] [--long-tokens 6000]
        [--only streams,fairness,editing,pairs] [--pairs 40] [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import statistics
import subprocess
import time
from pathlib import Path

import httpx
from bench_concurrency import crowd, one_stream, pct
from serving import free_port, start_api, stop, wait_up

FILE_LINES = 300
SHORT_CHATS = 8


def start_llama_server(binary: str, port: int, model: str, n_ctx: int, repack: bool, *extra: str) -> subprocess.Popen:
    threads = str(len(os.sched_getaffinity(0)))
    return subprocess.Popen([binary, "-m", model, "--port", str(port), "-c", str(n_ctx), "--parallel", "8",
                             "-kvu", *([] if repack else ["--no-repack"]), "--jinja", "-t", threads, "-tb", threads,
                             "--threads-http", "16", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@functools.cache
def source_file() -> str:
    """A file of code no model has seen: functions whose names, fields and numbers are drawn at
    random (with a fixed seed). (A file of near-repeated lines, `return [v * {i + 2} + {i % 7} ...]`,
    put Qwen2.5-Coder-0.5B at a near tie on line 66, where it continues the pattern or copies:
    which one a server wrote turned on the order its step summed in, and once it left the file
    every drafted line missed, so the servers' speeds compared different replies. A well-known
    module (the standard library's textwrap) it rewrote from memory rather than copied.)"""
    rng = random.Random(37)
    words = ["river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "engine", "window",
             "forest", "signal", "ledger", "marble", "cinder", "orchard", "beacon"]
    verbs = ["load", "merge", "split", "score", "trim", "group", "rank", "check"]
    lines: list[str] = []
    while len(lines) < FILE_LINES:
        a, b, c = rng.sample(words, 3)
        name = f"{rng.choice(verbs)}_{a}_{rng.randrange(10, 99)}"
        lines += [f"def {name}(records, limit={rng.randrange(2, 500)}):",
                  f'    """Keep the {a} entries of records above limit, by {b}."""',
                  f'    kept = [r for r in records if r.get("{a}", {rng.randrange(0, 9)}) > limit]',
                  f'    kept.sort(key=lambda r: r["{b}"], reverse={rng.choice(["True", "False"])})',
                  f'    return [r["{c}"] for r in kept[:{rng.randrange(3, 64)}]]', ""]
    return "\n".join(lines[:FILE_LINES])


@functools.cache
def renamed() -> tuple[str, str]:
    """The function the rewrite renames (the fifth), and its new name."""
    old = source_file().splitlines()[24].removeprefix("def ").split("(")[0]
    return old, "resize_" + old.split("_", 1)[1]


def followed(reply: str) -> tuple[int, int, str]:
    """How a reply holds the rewritten file (after a code fence's first line): its lines as wanted,
    its lines (the reply is cut at max_tokens), and the first line that is not as wanted."""
    lines = reply.splitlines()
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
    old, new = renamed()
    wanted = source_file().replace(f"def {old}(", f"def {new}(").splitlines()
    pairs = list(zip(lines, wanted, strict=False))
    wrong = next((a for a, b in pairs if a != b), "")
    return sum(a == b for a, b in pairs), len(pairs), wrong


def long_prompt(k: int, tokens: int) -> str:
    """About ``tokens`` tokens of text, different for each ``k`` (so no prefix is shared)."""
    words = ["river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "engine", "window", "forest"]
    body = " ".join(f"{words[(i * 7 + k) % 10]}{i % 97}" for i in range(tokens // 3))
    return f"Document {k}.\n{body}\nSummarise the document above in one sentence."


async def streams(base: str, model: str, n: int, round_: int) -> tuple[float, list[float]]:
    return await crowd(base, model, n, round_, 128)


async def fairness(base: str, model: str, long_tokens: int, round_: int) -> list[float]:
    """Times to first token of short chats sent while four long prompts are read."""
    async with httpx.AsyncClient(timeout=1200, limits=httpx.Limits(max_connections=64)) as client:
        longs = [asyncio.create_task(one_stream(
            client, base, model, [{"role": "user", "content": long_prompt(k + 10 * round_, long_tokens)}], 32))
            for k in range(4)]
        await asyncio.sleep(1.0)   # the long prompts are being read
        ttfts = []
        for i in range(SHORT_CHATS):
            ttft, *_ = await one_stream(client, base, model,
                                        [{"role": "user", "content": f"Say hello to guest {round_}-{i}."}], 8)
            ttfts.append(ttft)
            await asyncio.sleep(0.25)
        for task in longs:   # (what they write after the short chats is not measured: they are cut)
            task.cancel()
        await asyncio.gather(*longs, return_exceptions=True)
    return ttfts


async def editing(base: str, model: str, max_tokens: int) -> tuple[float, int, str]:
    """Generated tokens/s (from the first token to the last) of one rewrite, the tokens, and the reply."""
    old, new = renamed()
    ask = (f"Rewrite this file exactly as it is, changing only the name {old} to {new}. Reply with the whole "
           f"file and nothing else.\n\n{source_file()}")
    async with httpx.AsyncClient(timeout=1200) as client:
        t0 = time.perf_counter()
        ttft, tokens, end, text = await one_stream(client, base, model, [{"role": "user", "content": ask}],
                                                   max_tokens)
    return tokens / max(end - t0 - ttft, 1e-9), tokens, text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server (without it: this server alone)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=32768)
    ap.add_argument("--long-tokens", type=int, default=6000)
    ap.add_argument("--edit-tokens", type=int, default=1024, help="max_tokens of a rewrite")
    ap.add_argument("--only", default="streams,fairness,editing")
    ap.add_argument("--pairs", type=int, default=40, help="pairs of one-stream requests (the pairs workload)")
    ap.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    args = ap.parse_args()
    from openai_ext.hosts.files import default_gguf

    model = args.model or str(default_gguf())
    only = set(args.only.split(","))
    names = ["this server", "this server, speculation off"]
    if args.llama_server:
        names += ["llama-server", "llama-server, n-gram speculation"]
    ports = {name: free_port() for name in names}
    common = ["--model", model, "--n-ctx", str(args.n_ctx), "--parallel", "8"]
    procs = {
        "this server": start_api(ports["this server"], *common),
        "this server, speculation off": start_api(ports["this server, speculation off"], *common,
                                                  "--speculation", "off"),
    }
    if args.llama_server:
        # llama-server gets the extra CPU buffer types (weight repacking) exactly where this server
        # uses them: its own CPU test's verdict for this model
        from openai_ext.hosts.llamacpp import probe

        repack = probe.choose(Path(model)).extra_buffers
        print(f"extra CPU buffer types (repacking) for both: {'on' if repack else 'off'}")
        procs["llama-server"] = start_llama_server(args.llama_server, ports["llama-server"], model, args.n_ctx,
                                                   repack)
        procs["llama-server, n-gram speculation"] = start_llama_server(
            args.llama_server, ports["llama-server, n-gram speculation"], model, args.n_ctx, repack,
            "--spec-type", "ngram-simple")
    bases = {name: f"http://127.0.0.1:{port}/v1" for name, port in ports.items()}
    try:
        for name, proc in procs.items():
            if name.startswith("this"):
                wait_up(bases[name], proc)
        for name, proc in procs.items():   # llama-server's /v1/models answers while it loads; /health does not
            wait_up(bases[name].removesuffix("/v1"), proc, path="/health")
        plain = [name for name in ("this server", "llama-server") if name in procs]
        results: dict[tuple[str, str], list] = {}
        for r in range(args.rounds):
            # the servers take turns in one order, then in the other: on a VM whose speed drifts
            # from minute to minute, a fixed order favours whoever goes at the better moment
            order = 1 if r % 2 == 0 else -1
            for name in plain:   # (a first request each, so no one pays for a cold start)
                asyncio.run(streams(bases[name], "x", 1, 99))
            if "streams" in only:
                for n in (1, 8):
                    for name in plain[::order]:
                        tps, ttfts = asyncio.run(streams(bases[name], "x", n, r))
                        results.setdefault((f"streams {n}", name), []).append((tps, ttfts))
            if "fairness" in only:
                for name in plain[::order]:
                    results.setdefault(("fairness", name), []).append(
                        asyncio.run(fairness(bases[name], "x", args.long_tokens, r)))
            if "editing" in only:
                for name in list(bases)[::order]:
                    results.setdefault(("editing", name), []).append(
                        asyncio.run(editing(bases[name], "x", args.edit_tokens)))
        if "pairs" in only:
            # (this server with and without speculation, each paired with the same request to the
            # last contender; the order turns each time)
            contenders = ["this server", "this server, speculation off", *plain[1:]]
            for i in range(args.pairs):
                turned = contenders[i % len(contenders):] + contenders[:i % len(contenders)]
                for name in turned[::1 if i % 2 == 0 else -1]:
                    tps, ttfts = asyncio.run(streams(bases[name], "x", 1, 100 + i))
                    results.setdefault(("pairs", name), []).append((tps, ttfts[0]))
        report(results, args)
    finally:
        stop(list(procs.values()))


def report(results: dict[tuple[str, str], list], args) -> None:
    print(f"\n{os.cpu_count()} CPUs; {args.rounds} rounds; context {args.n_ctx}; every server --parallel 8")
    for n in (1, 8):
        rows = {name: v for (w, name), v in results.items() if w == f"streams {n}"}
        if not rows:
            continue
        print(f"\nstreams, N={n}: tokens/s (median of rounds), p95 first token (all clients of all rounds)")
        against = "llama-server" if "llama-server" in rows else "this server"
        base = statistics.median(t for t, _ in rows[against])
        for name, runs in rows.items():
            tps = statistics.median(t for t, _ in runs)
            ttfts = [x for _, ts in runs for x in ts]
            print(f"  {name:34} {tps:7.1f} tokens/s ({tps / base:.2f}x {against})  p95 first token "
                  f"{pct(ttfts, 0.95) * 1000:7.0f} ms")
    rows = {name: v for (w, name), v in results.items() if w == "pairs"}
    if rows:
        report_pairs(rows)
    rows = {name: v for (w, name), v in results.items() if w == "fairness"}
    if rows:
        print(f"\nfairness: short chats while four {args.long_tokens}-token prompts are read: time to first token")
        for name, runs in rows.items():
            ttfts = [x for ts in runs for x in ts]
            print(f"  {name:34} p50 {pct(ttfts, 0.5):6.2f} s  p95 {pct(ttfts, 0.95):6.2f} s  max {max(ttfts):6.2f} s")
    rows = {name: v for (w, name), v in results.items() if w == "editing"}
    if rows:
        print(f"\nediting: rewrite a {FILE_LINES}-line file (up to {args.edit_tokens} tokens): generated tokens/s")
        ours_off = statistics.median(t for t, _, _ in rows["this server, speculation off"])
        other = "llama-server, n-gram speculation"
        ls = statistics.median(t for t, _, _ in rows[other if other in rows else "this server"])
        for name, runs in rows.items():
            tps = statistics.median(t for t, _, _ in runs)
            print(f"  {name:34} {tps:7.1f} tokens/s ({tps / ours_off:.2f}x this server without speculation, "
                  f"{tps / ls:.2f}x {other if other in rows else 'this server'}; {runs[0][1]} tokens)")
        replies = {text for runs in rows.values() for _, _, text in runs}
        print(f"  replies: {'all the same' if len(replies) == 1 else f'{len(replies)} different ones'}")
        if len(replies) > 1:
            for name, runs in rows.items():
                for text in sorted({t for _, _, t in runs}):
                    right, lines, wrong = followed(text)
                    print(f"    {name}: {right} of {lines} lines as wanted; the first not: {wrong[:60]!r}")


def report_pairs(rows: dict[str, list[tuple[float, float]]]) -> None:
    """One stream, request by request: against the last contender, the median ratio of each
    pair's tokens/s with a 95% bootstrap interval (resampling the pairs) and the median gap of
    their times to first token; each contender's times to first token."""
    import numpy as np

    *names, other = rows
    n = len(rows[other])
    print(f"\npairs: one stream, {n} turns of one request to each contender back to back (order turning)")
    rng = np.random.default_rng(0)
    for name in names:
        ratios = np.array([x[0] / y[0] for x, y in zip(rows[name], rows[other], strict=True)])
        low, high = np.percentile(np.median(rng.choice(ratios, (2000, n)), axis=1), [2.5, 97.5])
        gaps = [x[1] - y[1] for x, y in zip(rows[name], rows[other], strict=True)]
        print(f"  {name} / {other}: tokens/s median ratio {np.median(ratios):.3f} (95% interval {low:.3f}-"
              f"{high:.3f}), faster in {int((ratios > 1).sum())} of {n}; first token "
              f"{statistics.median(gaps) * 1000:+.1f} ms (median of pairs)")
    for name, runs in rows.items():
        ttfts = [f for _, f in runs]
        print(f"  {name:34} {statistics.median(t for t, _ in runs):7.1f} tokens/s (median)  first token p50 "
              f"{pct(ttfts, 0.5) * 1000:5.0f} ms  p95 {pct(ttfts, 0.95) * 1000:5.0f} ms")


if __name__ == "__main__":
    main()
