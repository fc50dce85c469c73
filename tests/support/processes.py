"""``python -m openai_ext`` in a process of its own, as a user runs it: started on a free port with
a cache and a data folder of its own (never the user's), and stopped with Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx

from support import ROOT
from support.servers import free_port


class Served:
    def __init__(self, proc: subprocess.Popen, port: int, log):
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}/v1"

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()


def serve(tmp_path, *flags: str, path: list[str] | None = None, port: int | None = None,
          env: dict[str, str | None] | None = None) -> Served:
    """Starts the server and waits for its /health; ``path`` goes first on its PYTHONPATH (a
    stand-in module), ``port`` reuses a port (a restart), ``env`` sets variables (None: unset)."""
    port = port or free_port()
    env = {k: v for k, v in {**os.environ, "PYTHONPATH": os.pathsep.join([*(path or []), str(ROOT)]),
                             "XDG_CACHE_HOME": str(tmp_path), "OPENEDAI_DATA_DIR": str(tmp_path / "data"),
                             **(env or {})}.items() if v is not None}
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "openai_ext", "--port", str(port), *flags], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    served = Served(proc, port, log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, served.output()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the server did not start: {served.output()}")


def stop(served: Served, sig: int = signal.SIGINT) -> None:
    if served.proc.poll() is None:
        served.proc.send_signal(sig)
        served.proc.wait(timeout=60)
