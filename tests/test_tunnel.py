"""The public tunnel, end to end with a test double of the cloudflared binary
(tests/doubles/cloudflared), and its failure when the real binary cannot be downloaded."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOUBLE = Path(__file__).parent / "doubles" / "cloudflared" / "cloudflared_double.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, tmp: Path, **env):
    port = free_port()
    out = open(tmp / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "openai_ext", "--port", str(port), "--n-ctx", "512", *args],
                            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), **env})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/health", timeout=2)
            return proc, base, out
        except httpx.TransportError:
            assert proc.poll() is None, (tmp / "server.log").read_text()
            time.sleep(0.2)
    raise AssertionError("server did not start")


def wait_for(out, text, timeout=30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out.seek(0)
        log = out.read()
        if text in log:
            return log
        time.sleep(0.2)
    out.seek(0)
    raise AssertionError(f"{text!r} never appeared in:\n{out.read()}")


def stop(proc):
    proc.terminate()
    proc.wait(timeout=20)


@pytest.fixture
def fake_cloudflared(tmp_path):
    """Puts the double where flask-cloudflared keeps its downloaded binary (the temp folder)."""
    from flask_cloudflared import _get_command

    target = tmp_path / _get_command(platform.system(), platform.machine())
    shutil.copy(DOUBLE, target)
    target.chmod(0o755)
    return tmp_path / "cloudflared-calls.jsonl"


def test_tunnel_opens_and_prints_its_public_url(tmp_path, fake_cloudflared):
    proc, base, out = start(["--public-api", "--api-key", "k"], tmp_path,
                            CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared))
    try:
        log = wait_for(out, "Public API at")
        lines = [line for line in log.splitlines() if "Public API at" in line]
        assert lines == [lines[0]] and "https://quiet-double-tunnel.trycloudflare.com/v1" in lines[0]
        calls = [json.loads(line) for line in fake_cloudflared.read_text().splitlines()]
        tunnel = next(c for c in calls if c[0] == "tunnel")
        port = base.rsplit(":", 1)[1]
        assert tunnel[tunnel.index("--url") + 1] == f"http://127.0.0.1:{port}"
        assert tunnel[tunnel.index("--metrics") + 1].startswith("127.0.0.1:")
        # requests through the tunnel carry its hostname: the Host check must let them in
        r = httpx.get(base + "/v1/models", headers={"Host": "quiet-double-tunnel.trycloudflare.com",
                                                    "Authorization": "Bearer k"})
        assert r.status_code == 200
    finally:
        stop(proc)


def test_named_tunnel(tmp_path, fake_cloudflared):
    proc, base, out = start(["--public-api", "--public-api-id", "my-tunnel", "--api-key", "k"], tmp_path,
                            CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared))
    try:
        log = wait_for(out, "Public API at the hostname of tunnel my-tunnel")
        assert "allowed_hosts" in next(line for line in log.splitlines() if "Public API at" in line)
        calls = [json.loads(line) for line in fake_cloudflared.read_text().splitlines()]
        assert ["tunnel", "run", "my-tunnel"] == next(c for c in calls if c[0] == "tunnel")[:3]
    finally:
        stop(proc)


def test_no_tunnel_without_an_api_key(tmp_path, fake_cloudflared):
    proc, base, out = start(["--public-api"], tmp_path, CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared))
    try:
        log = wait_for(out, "Not opening the public tunnel")
        assert "Public API at" not in log and not fake_cloudflared.exists()
        assert httpx.get(base + "/v1/models").status_code == 200
        # no tunnel, so the DNS-rebinding defence stays fully on
        for name in ("attacker.example", "x.trycloudflare.com"):
            assert httpx.get(base + "/v1/models", headers={"Host": name}).status_code == 400
    finally:
        stop(proc)


def test_open_tunnel_when_explicitly_allowed(tmp_path, fake_cloudflared):
    proc, base, out = start(["--public-api", "--allow-open-tunnel"], tmp_path,
                            CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared))
    try:
        wait_for(out, "Public API at")
    finally:
        stop(proc)


def test_download_failure_is_one_line_and_the_server_keeps_serving(tmp_path):
    # No binary in the temp folder: flask-cloudflared tries to download it, which fails offline.
    proc, base, out = start(["--public-api", "--api-key", "k"], tmp_path,
                            HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    try:
        log = wait_for(out, "could not start", timeout=60)
        # one line, on all the attempts: flask-cloudflared's own progress prints are not shown
        errors = [line for line in log.splitlines() if "tunnel" in line.lower() or "cloudflared" in line.lower()]
        assert len(errors) == 1 and "keeps serving locally" in errors[0], log
        r = httpx.post(base + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                       headers={"Authorization": "Bearer k"}, timeout=60)
        assert r.status_code == 200
    finally:
        stop(proc)
