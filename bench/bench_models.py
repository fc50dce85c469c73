"""What serving several models by name costs, side by side in one run, on one server started with
a catalog of two models (the embedded GGUF under two names, in a models_dir):

- a short chat to the default model (the baseline);
- the same chat to a catalog model that is loaded already (what naming a model costs);
- the first chat to a catalog model that is not loaded (its load on demand, then the answer);
- two catalog models asked in turn, with room for both (max_loaded_models 3) against room for one
  (max_loaded_models 2: each request unloads the other model, the least recently used, and loads
  its own): what the budget costs when a client alternates.

Printed: median and p95 milliseconds per request, and ratios against the baseline.

    python bench/bench_models.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from serving import exited, free_port, start_api, stop, wait_up

from openai_ext.hosts.files import default_gguf

BODY = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0}


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    return f"median {statistics.median(ms):8.1f} ms  p95 {ms[max(0, int(len(ms) * 0.95) - 1)]:8.1f} ms"


def ask(client: httpx.Client, base: str, model: str) -> float:
    t = time.perf_counter()
    r = client.post(f"{base}/chat/completions", json={**BODY, "model": model})
    r.raise_for_status()
    return (time.perf_counter() - t) * 1000


def serve(folder: Path, max_loaded: int):
    port = free_port()
    proc = start_api(port, "--models-dir", str(folder), "--max-loaded-models", str(max_loaded),
                     "--keep-alive", "-1", "--n-ctx", "2048", "--parallel", "1")
    base = f"http://127.0.0.1:{port}/v1"
    wait_up(base, proc)
    return proc, base


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp())
    for name in ("alpha", "beta"):
        (folder / f"{name}.gguf").symlink_to(default_gguf())
    client = httpx.Client(timeout=300)

    proc, base = serve(folder, 3)
    try:
        ask(client, base, "gpt-4o")   # warm
        cold = [ask(client, base, "alpha")]   # alpha's load on demand, then its answer
        default, named = [], []
        for _ in range(args.rounds):   # alternate, so that a slower moment hits both
            default.append(ask(client, base, "gpt-4o"))
            named.append(ask(client, base, "alpha"))
        ask(client, base, "beta")
        both = [ask(client, base, ("alpha", "beta")[i % 2]) for i in range(args.rounds)]
        exited(proc)
    finally:
        stop([proc])

    proc, base = serve(folder, 2)
    try:
        ask(client, base, "gpt-4o")
        swapping = [ask(client, base, ("alpha", "beta")[i % 2]) for i in range(args.rounds)]
        exited(proc)
    finally:
        stop([proc])

    base_ms = statistics.median(default)
    print(f"default model                       {summary(default)}")
    print(f"catalog model, loaded               {summary(named)}  {statistics.median(named) / base_ms:5.2f}x")
    print(f"catalog model, first request (load) {cold[0]:8.1f} ms          {cold[0] / base_ms:5.1f}x")
    print(f"two models in turn, room for both   {summary(both)}  {statistics.median(both) / base_ms:5.2f}x")
    print(f"two models in turn, room for one    {summary(swapping)}  {statistics.median(swapping) / base_ms:5.2f}x")


if __name__ == "__main__":
    main()
