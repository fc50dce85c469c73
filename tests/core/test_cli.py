"""Standalone mode from the command line: real processes, real sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from support import ROOT
from support.servers import free_port


def run(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.slow  # starts a process
def test_python_m_openai_ext_serves_the_embedded_model_on_localhost():
    port = free_port()
    proc = run(["-m", "openai_ext", "--port", str(port), "--n-ctx", "1024"])
    try:
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                models = httpx.get(f"{base}/models", timeout=2).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1"
        r = httpx.post(f"{base}/chat/completions", timeout=60, json={
            "model": "gpt-3.5-turbo", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        # bound to localhost only, unless listening is turned on
        conns = [c for c in _listening(port)]
        assert conns and all(c.startswith("127.0.0.1") for c in conns), conns
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _listening(port):
    """Addresses listening on ``port``, read from the kernel's socket table (Linux)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.append("127.0.0.1" if addr == "0100007F" else addr)
    return found


def test_port_in_use_prints_one_clear_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        # a model that does not exist: the port is checked first, before any model loads
        proc = run(["script.py", "--port", str(port), "--model", "/nonexistent/model.gguf"])
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "no model file" not in out
    lines = [line for line in out.splitlines() if "already in use" in line]
    assert len(lines) == 1 and "--port" in lines[0] and "OPENEDAI_PORT" in lines[0]
    assert "Traceback" not in out


def test_missing_model_file_is_a_clear_error(tmp_path):
    proc = run(["-m", "openai_ext", "--model", str(tmp_path / "nope.gguf"), "--port", str(free_port())])
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "There is no model file" in out and "nope.gguf" in out and "Traceback" not in out
    assert "hub reference (org/repo" in out   # what else --model takes


@pytest.mark.slow  # starts a process
def test_a_bad_setting_ends_the_process_in_one_clear_line(tmp_path):
    bad = tmp_path / "settings.json"
    bad.write_text("{oops")
    proc = run(["-m", "openai_ext", "--settings", str(bad), "--port", str(free_port())])
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in out
    lines = [line for line in out.splitlines() if "not valid JSON" in line]
    assert len(lines) == 1 and str(bad) in lines[0]
    # an HTTPS file that is not there, found once the server is built
    proc = run(["-m", "openai_ext", "--port", str(free_port()), "--n-ctx", "256",
                "--cert-path", str(tmp_path / "no-cert.pem"), "--key-path", str(tmp_path / "no-key.pem")])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in out
    assert len([line for line in out.splitlines() if "no-cert.pem" in line]) == 1


@pytest.mark.parametrize("flag,value,setting,expected", [
    ("--cors-origins", '["http://localhost:3000"]', "cors_origins", ["http://localhost:3000"]),
    ("--allowed-hosts", '["mybox.lan", "api.local"]', "allowed_hosts", ["mybox.lan", "api.local"]),
    ("--tts-voices", '{"alloy": "en_US-lessac-medium"}', "tts_voices", {"alloy": "en_US-lessac-medium"}),
    ("--piper-voices", '{"v": {"model": "/m.onnx", "config": "/m.json"}}', "piper_voices",
     {"v": {"model": "/m.onnx", "config": "/m.json"}}),
    ("--max-queue", "7", "max_queue", 7),
    ("--api-key", "k", "api_key", "k"),
])
def test_every_kind_of_flag_takes_what_help_says(flag, value, setting, expected, tmp_path):
    from openai_ext.__main__ import parse_args
    from openai_ext.core.config import load_settings

    args = parse_args([flag, value])
    settings = load_settings(cli={k: v for k, v in vars(args).items() if k != "settings"},
                             file=str(tmp_path / "none.json"))
    assert getattr(settings, setting) == expected


def test_every_setting_has_a_flag_whose_type_matches_the_setting():
    import typing

    from openai_ext.__main__ import _flag_type, _json, _list
    from openai_ext.core.config import Settings

    for name, field in Settings.model_fields.items():
        if field.annotation is bool:
            continue
        kind = _flag_type(field.annotation)
        origin = typing.get_origin(field.annotation)
        if origin in (list, dict):
            assert kind is (_list if origin is list else _json), name


def test_a_table_flag_that_is_not_json_is_one_clear_line(capsys):
    from openai_ext.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--tts-voices", "alloy=amy"])
    err = capsys.readouterr().err
    assert "is not JSON" in err and "--tts-voices" in err


def test_a_list_flag_takes_json_or_comma_separated_items():
    from openai_ext.__main__ import parse_args

    assert parse_args(["--mcp-allow", "localhost:8000, *.example.com"]).mcp_allow == ["localhost:8000",
                                                                                     "*.example.com"]
    assert parse_args(["--cors-origins", '["http://a:1", "http://b:2"]']).cors_origins == ["http://a:1", "http://b:2"]
    with pytest.raises(SystemExit):
        parse_args(["--mcp-allow", "[not json"])
