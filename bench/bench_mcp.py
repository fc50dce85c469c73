"""What an MCP operation costs this server, side by side in one run: a tool call (and a tool list)
as the server makes it, over a connection of its own (connect, handshake, request), against the
same request on one session kept open, on a real MCP server (the official SDK's, on loopback).
Printed: median and p95 milliseconds of each, and the ratio, per transport. The gap is what a
pool of sessions per server and credential would save.

    python bench/bench_mcp.py [--rounds 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from serving import ROOT

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.mcp_servers import start_demo_server  # noqa: E402

from openai_ext.mcp import client  # noqa: E402


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    return f"median {statistics.median(ms):7.2f} ms  p95 {ms[int(len(ms) * 0.95) - 1]:7.2f} ms"


async def run(url: str, rounds: int) -> None:
    server = client.Server("bench", url)
    limits = client.Limits(timeout=30, max_result_bytes=100_000)
    fresh: dict[str, list[float]] = {"list": [], "call": []}
    kept: dict[str, list[float]] = {"list": [], "call": []}
    async with client.connected(server, limits) as session:
        for i in range(rounds):   # alternate, so that a slower moment hits both
            t = time.perf_counter()
            await client.list_tools(server, limits)
            fresh["list"].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            await client.call_tool(server, "add", {"a": i, "b": 1}, limits)
            fresh["call"].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            await session.list_tools(cache_mode="refresh")
            kept["list"].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            await session.call_tool("add", {"a": i, "b": 1})
            kept["call"].append((time.perf_counter() - t) * 1000)
    for op in ("list", "call"):
        ratio = statistics.median(fresh[op]) / statistics.median(kept[op])
        print(f"  {op}: own connection {summary(fresh[op])} | kept session {summary(kept[op])} | {ratio:.1f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=50)
    args = p.parse_args()
    demo = start_demo_server()
    try:
        for name, url in (("Streamable HTTP", demo.url), ("SSE", demo.sse_url)):
            print(f"{name} ({args.rounds} rounds):")
            asyncio.run(run(url, args.rounds))
    finally:
        demo.stop()


if __name__ == "__main__":
    main()
