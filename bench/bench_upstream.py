"""The extra hop: streamed chat through this server in front of an upstream engine, against the
same upstream asked directly, side by side in one run.

The upstream is another instance of this server on the embedded model (or llama-server, with
--llama-server PATH); the front runs with --upstream-url. Greedy decoding, so both paths generate
the same tokens. Single streams alternate between the two paths (and which goes first); then N
clients at once, through and direct in turn. Printed: time to first token (TTFT) as a difference,
decode speed and the N-client aggregate as ratios of direct.

    python bench/bench_upstream.py [--rounds 4] [--max-tokens 128] [--clients 8]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from serving import PROMPTS, free_port, start_api, stop, stream_chat, wait_up


def start_llama_server(binary: str, port: int, model: str, parallel: int) -> subprocess.Popen:
    return subprocess.Popen([binary, "-m", model, "--port", str(port), "-c", str(2048 * parallel), "--parallel",
                             str(parallel), "--jinja", "--threads-http", str(parallel + 4)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def aggregate(base: str, clients: int, max_tokens: int, model: str) -> float:
    """Tokens per second over ``clients`` streams started together."""
    def one(i: int) -> int:
        with httpx.Client(timeout=600) as c:
            return stream_chat(c, f"{base}/chat/completions", PROMPTS[i % len(PROMPTS)], max_tokens, model)[2]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, range(clients)))
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--llama-server", help="path of llama-server, to use it as the upstream")
    args = ap.parse_args()

    up_port, front_port = free_port(), free_port()
    up = f"http://127.0.0.1:{up_port}/v1"
    front = f"http://127.0.0.1:{front_port}/v1"
    data = tempfile.TemporaryDirectory()
    procs = []
    try:
        if args.llama_server:
            from openai_ext.hosts.files import default_gguf

            procs.append(start_llama_server(args.llama_server, up_port, str(default_gguf()), args.clients))
            model = "local"
        else:
            procs.append(start_api(up_port, "--parallel", str(args.clients), "--n-ctx", str(1024 * args.clients),
                                   "--data-dir", data.name))
            model = "local"
        # (llama-server's /v1/models answers while the model still loads; its /health does not)
        wait_up(up.removesuffix("/v1") if args.llama_server else up, procs[0],
                path="/health" if args.llama_server else "/models")
        procs.append(start_api(front_port, "--upstream-url", up, "--upstream-parallel", str(args.clients),
                               "--data-dir", data.name))
        wait_up(front, procs[1])
        paths = {"direct": up, "through": front}
        # A new connection per request, on both paths alike: llama-server closes a kept-alive
        # connection after a stream, and a reused dead one would end the run.
        client = httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))
        for base in paths.values():
            stream_chat(client, f"{base}/chat/completions", "Hello", 16, model)   # warm-up
        single: dict[str, list[tuple[float, float, int]]] = {"direct": [], "through": []}
        for r in range(args.rounds):
            for p, prompt in enumerate(PROMPTS):
                order = list(paths) if (r + p) % 2 == 0 else list(paths)[::-1]
                for name in order:
                    single[name].append(stream_chat(client, f"{paths[name]}/chat/completions", prompt,
                                                    args.max_tokens, model))
        many: dict[str, list[float]] = {"direct": [], "through": []}
        for r in range(max(2, args.rounds // 2)):
            for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
                many[name].append(aggregate(paths[name], args.clients, args.max_tokens, model))
    except httpx.TransportError:
        print("exit codes:", [proc.poll() for proc in procs])
        for proc in procs:
            log = getattr(proc, "log", None)
            if log is not None:
                log.seek(0)
                print(log.read()[-3000:])
        raise
    finally:
        stop(procs)
        data.cleanup()

    upstream = "llama-server" if args.llama_server else "this server (embedded SmolLM2)"
    print(f"upstream: {upstream}; {args.rounds} rounds x {len(PROMPTS)} prompts, up to {args.max_tokens} tokens, "
          "greedy")
    print(f"\n{'path':10} {'TTFT ms':>9} {'decode tok/s':>13} {f'N={args.clients} tok/s':>12}")
    for name in paths:
        rows = single[name]
        print(f"{name:10} {statistics.median(x[0] for x in rows) * 1000:9.1f} "
              f"{statistics.median(x[1] for x in rows):13.1f} {statistics.median(many[name]):12.1f}")
    pairs = list(zip(single["through"], single["direct"], strict=False))
    extra = [(a[0] - b[0]) * 1000 for a, b in pairs]
    ratio = [a[1] / b[1] for a, b in pairs]
    agg = statistics.median(many["through"]) / statistics.median(many["direct"])
    print(f"\nthrough vs direct: TTFT {statistics.median(extra):+.2f} ms (quartiles "
          f"{statistics.quantiles(extra, n=4)[0]:+.2f} / {statistics.quantiles(extra, n=4)[2]:+.2f}), decode "
          f"{statistics.median(ratio):.3f}x, N={args.clients} aggregate {agg:.3f}x")


if __name__ == "__main__":
    main()
