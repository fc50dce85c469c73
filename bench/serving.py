"""What the benchmarks share: a free port, and a server started in its own process."""

from __future__ import annotations

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
    """Stops the benchmark with the server's log if the server has exited."""
    if proc.poll() is not None:
        proc.log.seek(0)
        raise SystemExit(f"server exited: {proc.log.read()}")


def wait_up(base: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited(proc)
        try:
            if httpx.get(f"{base}/models", timeout=2).status_code == 200:
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
