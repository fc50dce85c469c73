"""Requests that do not need the store, served while the store is frozen, against the same with the
store healthy, side by side in one run.

A throwaway PostgreSQL cluster holds the server's store (--database-url). Each round has two phases,
in alternating order: the store healthy, and the store frozen (every process of the cluster stopped
with SIGSTOP: its port still accepts connections, nothing answers). In both, ``--clients`` clients
send short chat completions and ``store: false`` responses back to back (greedy, ``--max-tokens``),
and three more keep asking for what needs the store (one retrieves a stored response, one
creates conversations, one continues a response that does not exist): answered at once while the
store is healthy (a 404 for the last), a 503 while it is frozen. Printed: requests per second of
the clients that do not need the store, frozen against healthy (goal: at least 0.9x), and what
the store clients got. ``--database-timeout 0`` starts the server without the flag (its default).

    python bench/bench_store_outage.py [--rounds 3] [--seconds 10] [--clients 4] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from serving import ROOT, free_port, start_api, stop, wait_up

sys.path.insert(0, str(ROOT / "tests"))
from support.postgres import PostgresServer, binaries  # noqa: E402


def phase(base: str, clients: int, seconds: float, max_tokens: int, stored_id: str) -> tuple[float, dict[int, int]]:
    """Requests per second of the clients that need no store, and the store client's answers by status."""
    end = time.monotonic() + seconds
    done = [0] * clients
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def plain(i: int) -> None:
        # a request still unanswered well after the phase has ended counts as not served
        with httpx.Client(timeout=seconds + 30) as c:
            k = 0
            while time.monotonic() < end:
                try:
                    if (i + k) % 2:
                        r = c.post(f"{base}/chat/completions", json={
                            "model": "x", "temperature": 0, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": f"Say something about the number {k}."}]})
                    else:
                        r = c.post(f"{base}/responses", json={
                            "model": "x", "temperature": 0, "max_output_tokens": 16, "store": False,
                            "input": f"Say something about the number {k}."})
                except httpx.TimeoutException:
                    return
                r.raise_for_status()
                if time.monotonic() <= end:
                    done[i] += 1
                k += 1

    def needs_store(k: int) -> None:
        with httpx.Client(timeout=seconds + 30) as c:
            while time.monotonic() < end:
                try:
                    r = ask(c, k)
                except httpx.TimeoutException:
                    with lock:
                        statuses[0] = statuses.get(0, 0) + 1   # 0: no answer
                    return
                with lock:
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                time.sleep(0.05)

    def ask(c: httpx.Client, k: int) -> httpx.Response:
        if k % 3 == 0:
            return c.get(f"{base}/responses/{stored_id}")
        if k % 3 == 1:
            return c.post(f"{base}/conversations", json={})
        # read from the store before it is prepared: a 404 while it answers
        return c.post(f"{base}/responses", json={"model": "x", "input": "Go on.", "max_output_tokens": 16,
                                                 "previous_response_id": "resp_0123456789abcdef"})

    t0 = time.monotonic()
    with ThreadPoolExecutor(clients + 3) as pool:
        futures = [pool.submit(plain, i) for i in range(clients)] + [pool.submit(needs_store, k) for k in range(3)]
        for f in futures:
            f.result()
    return sum(done) / (min(time.monotonic(), end) - t0), statuses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--database-timeout", type=float, default=2.0, help="0: the server's default")
    args = ap.parse_args()
    found = binaries()
    if found is None:
        raise SystemExit("PostgreSQL is not installed (initdb and pg_ctl not found)")
    pg = PostgresServer(found).start()
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    data = tempfile.TemporaryDirectory()
    procs = []
    try:
        url = pg.url(pg.new_database())
        deadline = ["--database-timeout", str(args.database_timeout)] if args.database_timeout else []
        procs.append(start_api(port, "--parallel", str(args.clients), "--database-url", url, *deadline,
                               "--data-dir", data.name))
        wait_up(base, procs[0])
        stored = httpx.post(f"{base}/responses", timeout=120, json={
            "model": "x", "input": "Keep this.", "max_output_tokens": 16}).json()["id"]
        phase(base, args.clients, 2.0, args.max_tokens, stored)   # warm-up
        rates: dict[str, list[float]] = {"healthy": [], "frozen": []}
        for r in range(args.rounds):
            for name in (("healthy", "frozen") if r % 2 == 0 else ("frozen", "healthy")):
                if name == "frozen":
                    pg.freeze()
                try:
                    rps, statuses = phase(base, args.clients, args.seconds, args.max_tokens, stored)
                finally:
                    if name == "frozen":
                        pg.thaw()
                rates[name].append(rps)
                print(f"round {r + 1} {name:8s} {rps:6.2f} requests/s  store clients: {dict(sorted(statuses.items()))}",
                      flush=True)
                if name == "frozen":   # found again by the server itself before the next phase
                    while httpx.get(base.removesuffix("/v1") + "/health", timeout=30).status_code != 200:
                        time.sleep(0.2)
        healthy, frozen = statistics.median(rates["healthy"]), statistics.median(rates["frozen"])
        print(f"\nrequests/s without the store, median of {args.rounds}: healthy {healthy:.2f}, frozen {frozen:.2f}: "
              f"{frozen / healthy:.3f}x (goal >= 0.9x)")
    finally:
        stop(procs)
        pg.stop()


if __name__ == "__main__":
    main()
