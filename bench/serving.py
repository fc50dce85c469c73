"""What the benchmarks share: a free port, a server started in its own process, the prompts of the
streaming benchmarks and one streamed chat request timed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str]) -> subprocess.Popen:
    """``python <args>`` from the project root. Its log goes to a file: a full pipe would block a
    chatty server."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            text=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def start_api(port: int, *flags: str) -> subprocess.Popen:
    """This project's server (python -m openai_ext) on ``port``."""
    return start_server(["-m", "openai_ext", "--port", str(port), *flags])


def exited(proc: subprocess.Popen) -> None:
    """Stops the benchmark with the server's log (where it kept one) if the server has exited."""
    if proc.poll() is not None:
        log = getattr(proc, "log", None)   # (start_server's; llama-server's is not kept)
        if log is not None:
            log.seek(0)
        raise SystemExit(f"server exited ({proc.returncode}): {log.read() if log is not None else ''}")


def wait_up(base: str, proc: subprocess.Popen, timeout: float = 180, path: str = "/models") -> None:
    """Waits until ``base + path`` answers 200. llama-server's /v1/models answers while its model
    still loads: ask its /health (``base`` without /v1) instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited(proc)
        try:
            if httpx.get(f"{base}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not start")


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


PROMPTS = [
    "Write a long story about a dragon who learns to bake bread.",
    "Write a long story about a lighthouse keeper and a storm.",
    "Write a long story about a robot exploring an old library.",
    "Write a long story about two friends crossing a desert.",
    "Write a long story about a cat who becomes a sailor.",
    "Write a long story about a village that forgot how to sing.",
]


def stream_chat(client: httpx.Client, url: str, prompt: str, max_tokens: int,
                model: str = "local") -> tuple[float, float, int]:
    """One streamed, greedy chat completion at ``url``: (seconds to the first text, decode
    tokens/s after it, tokens). Servers that ignore include_usage send one chunk per token."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    usage, chunks = None, 0
    with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"{url} answered {r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or now
                last = now
                chunks += 1
    n = usage["completion_tokens"] if usage else chunks
    return first - t0, (n - 1) / (last - first), n
