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
from support import DOUBLES, ROOT
from support.servers import free_port, has_ipv6_loopback

pytestmark = pytest.mark.slow

DOUBLE = DOUBLES / "cloudflared" / "cloudflared_double.py"


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
    log = tmp_path / "cloudflared-calls.jsonl"
    yield log
    # every cloudflared started has ended, by the time the server has (its metrics port is closed)
    for call in calls_of(log) if log.exists() else []:
        if call[0] == "tunnel":
            assert ended(call[call.index("--metrics") + 1]), f"cloudflared {call} outlived the server"


def ended(address: str, timeout: float = 10.0) -> bool:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            return True
        time.sleep(0.2)
    return False


def calls_of(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_tunnel_opens_and_prints_its_public_url(tmp_path, fake_cloudflared):
    proc, base, out = start(["--public-api", "--api-key", "k"], tmp_path,
                            CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared))
    try:
        log = wait_for(out, "Public API at")
        lines = [line for line in log.splitlines() if "Public API at" in line]
        assert lines == [lines[0]] and "https://quiet-double-tunnel.trycloudflare.com/v1" in lines[0]
        tunnels = [c for c in calls_of(fake_cloudflared) if c[0] == "tunnel"]
        port = base.rsplit(":", 1)[1]
        assert len(tunnels) == 1
        assert tunnels[0][:2] == ["tunnel", "--metrics"] and tunnels[0][3:] == ["--url", f"http://127.0.0.1:{port}"]
        assert tunnels[0][2].startswith("127.0.0.1:")
        # requests through the tunnel carry its hostname: the Host check must let them in
        r = httpx.get(base + "/v1/models", headers={"Host": "quiet-double-tunnel.trycloudflare.com",
                                                    "Authorization": "Bearer k"})
        assert r.status_code == 200
    finally:
        stop(proc)


def test_a_tunnel_that_gets_no_address_is_retried(tmp_path, fake_cloudflared):
    """The first cloudflared never registers with the edge: its metrics name no trycloudflare.com
    address, and flask-cloudflared returns None. That attempt fails, and the next one succeeds."""
    proc, base, out = start(["--public-api", "--api-key", "k"], tmp_path,
                            CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared), CLOUDFLARED_DOUBLE_PENDING="1")
    try:
        log = wait_for(out, "Public API at", timeout=60)
        lines = [line for line in log.splitlines() if "Public API at" in line]
        assert len(lines) == 1 and "https://quiet-double-tunnel.trycloudflare.com/v1" in lines[0], log
        assert "could not start" not in log and "None" not in log
        assert len([c for c in calls_of(fake_cloudflared) if c[0] == "tunnel"]) == 2
    finally:
        stop(proc)


def test_a_tunnel_that_never_gets_an_address_is_one_error_line(tmp_path, fake_cloudflared):
    proc, base, out = start(["--public-api", "--api-key", "k"], tmp_path,
                            CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared), CLOUDFLARED_DOUBLE_PENDING="99")
    try:
        log = wait_for(out, "could not start", timeout=90)
        assert "Public API at" not in log and "no trycloudflare.com address" in log
        assert len([c for c in calls_of(fake_cloudflared) if c[0] == "tunnel"]) == 3
        assert httpx.get(base + "/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
    finally:
        stop(proc)


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
@pytest.mark.parametrize("listen_host", ["::", "::1"])
def test_the_tunnel_forwards_to_an_address_that_is_bound(tmp_path, fake_cloudflared, listen_host):
    proc, base, out = start(["--public-api", "--api-key", "k", "--listen", "--listen-host", listen_host],
                            tmp_path, CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared))
    try:
        wait_for(out, "Public API at")
        tunnel = next(c for c in calls_of(fake_cloudflared) if c[0] == "tunnel")
        origin = tunnel[tunnel.index("--url") + 1]
        assert httpx.get(origin + "/health").status_code == 200
        port = base.rsplit(":", 1)[1]
        assert httpx.get(f"http://[::1]:{port}/health").status_code == 200
    finally:
        stop(proc)


@pytest.mark.parametrize("args, refusal", [
    (["tunnel", "--metrics", "127.0.0.1:1", "--url", "http://127.0.0.1:2", "--protocol", "quic"],
     "flag provided but not defined: -protocol"),
    (["tunnel", "--url", "http://127.0.0.1:2"], "--metrics"),
    (["tunnel", "--metrics", "127.0.0.1:1"], "--url"),
    (["tunnel", "--metrics", "127.0.0.1:1", "--url", "127.0.0.1:2"], "--url"),
    (["tunnel", "run", "my-tunnel", "--metrics", "127.0.0.1:1", "--url", "http://127.0.0.1:2"], "no --url"),
    (["tunnel", "login", "--metrics", "127.0.0.1:1"], "unexpected arguments"),
    (["update", "--force"], "unsupported command"),
    (["service", "install"], "unsupported command"),
])
def test_the_double_refuses_what_flask_cloudflared_never_passes(args, refusal):
    r = subprocess.run([sys.executable, str(DOUBLE), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "Incorrect Usage" in r.stderr and refusal in r.stderr, r.stderr


def test_named_tunnel(tmp_path, fake_cloudflared):
    proc, base, out = start(["--public-api", "--public-api-id", "my-tunnel", "--api-key", "k"], tmp_path,
                            CLOUDFLARED_DOUBLE_LOG=str(fake_cloudflared))
    try:
        log = wait_for(out, "Public API at the hostname of tunnel my-tunnel")
        assert "allowed_hosts" in next(line for line in log.splitlines() if "Public API at" in line)
        tunnel = next(c for c in calls_of(fake_cloudflared) if c[0] == "tunnel")
        assert tunnel[:4] == ["tunnel", "run", "my-tunnel", "--metrics"] and len(tunnel) == 5
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
        assert httpx.get(base + "/v1/models").status_code == 200
        # but nobody on the internet may manage the models or stop generations
        for method, path in (("GET", "/v1/internal/model/list"), ("POST", "/v1/internal/model/unload"),
                             ("POST", "/v1/internal/stop-generation")):
            r = httpx.request(method, base + path)
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required", r.text
        assert httpx.get(base + "/health").json()["model_loaded"]
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
