"""The extension's life inside the web UI: where its setup failures are told, how it keeps
serving with --nowebui and stops with the web UI, and the folder names the web UI reserves."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import ROOT
from support.servers import free_port
from support.spec import assert_valid_stream
from support.webui import load_extension

HERE = Path(__file__).parent


@pytest.fixture
def web_ui_logging(monkeypatch):
    """The root logger as the web UI leaves it: a NullHandler only (modules/logging_colors.py
    calls logging.basicConfig(handlers=[NullHandler()])), so a record that reaches only the root
    is printed nowhere."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])
    monkeypatch.setattr(root, "level", logging.ERROR)


def console(host_modules) -> list[str]:
    """What the web UI's own logger printed (the double keeps its lines, as the host's ring buffer)."""
    return list(host_modules.logging_colors.logger.buffer)


# --- setup failures, in the web UI's console -------------------------------------------------------

def test_a_taken_port_is_one_line_in_the_web_uis_console(host_modules, web_ui_logging):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        host_modules.shared.settings["openai_ext-port"] = taken.getsockname()[1]
        ext = load_extension(host_modules.shared)
    assert ext.server is None
    lines = [line for line in console(host_modules) if "not started" in line]
    assert len(lines) == 1, console(host_modules)
    assert "already in use" in lines[0] and "openai_ext-port" in lines[0] and "\n" not in lines[0]


def test_a_bad_setting_is_one_line_in_the_web_uis_console(host_modules, web_ui_logging):
    host_modules.shared.settings["openai_ext-port"] = "not a port"
    ext = load_extension(host_modules.shared)
    assert ext.server is None
    lines = [line for line in console(host_modules) if "not started" in line]
    assert len(lines) == 1 and "port" in lines[0] and "\n" not in lines[0]


def test_an_address_that_cannot_be_bound_is_one_line(host_modules, web_ui_logging):
    """Not every bind failure is a taken port: a listen_host this machine does not have."""
    shared = host_modules.shared
    shared.args.listen, shared.args.listen_host = True, "192.0.2.1"   # TEST-NET-1: never local
    shared.settings["openai_ext-port"] = free_port()
    ext = load_extension(shared)
    assert ext.server is None
    lines = [line for line in console(host_modules) if "not started" in line]
    assert len(lines) == 1 and "192.0.2.1" in lines[0] and "\n" not in lines[0], console(host_modules)


def test_a_refused_tunnel_is_one_line_and_the_api_serves_locally(host_modules, web_ui_logging):
    shared = host_modules.shared
    shared.settings.update({"openai_ext-port": free_port(), "openai_ext-public_api": True})
    ext = load_extension(shared)
    try:
        assert ext.server is not None
        lines = [line for line in console(host_modules) if "tunnel" in line]
        assert len(lines) == 1 and "api_key" in lines[0] and "\n" not in lines[0], console(host_modules)
        assert httpx.get(f"{ext.server.url}/models").status_code == 200
    finally:
        ext.server.stop()


def test_without_the_web_uis_logger_the_line_goes_to_stderr(host_modules, web_ui_logging, monkeypatch, capfd):
    """A host without modules.logging_colors (an older web UI): stderr, once."""
    monkeypatch.setitem(sys.modules, "modules.logging_colors", None)   # import fails
    host_modules.shared.settings["openai_ext-port"] = "not a port"
    ext = load_extension(host_modules.shared)
    assert ext.server is None
    lines = [line for line in capfd.readouterr().err.splitlines() if "not started" in line]
    assert len(lines) == 1 and "port" in lines[0]


def test_warnings_while_serving_reach_the_web_uis_console(host_modules, web_ui_logging):
    """The web UI's root logger stops at ERROR; the extension's warnings (a prompt cut to fit,
    a stalled stream dropped) must still be seen."""
    shared = host_modules.shared
    shared.settings.update({"openai_ext-port": free_port(), "openai_ext-truncate_prompt": True})
    shared.settings["truncation_length"] = 64
    ext = load_extension(shared)
    try:
        r = httpx.post(f"{ext.server.url}/completions", json={"prompt": "x" * 200, "max_tokens": 2}, timeout=30)
        assert r.status_code == 200
        assert [line for line in console(host_modules) if "prompt cut" in line]
    finally:
        ext.server.stop()


# --- --nowebui ---------------------------------------------------------------------------------------

def _start_nowebui(*, api: bool = False) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "nowebui_main.py"), str(port), "--api" if api else ""],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, port


def _ended(proc: subprocess.Popen) -> tuple[str, str]:
    """What the process wrote, once it has ended (read through the same buffered pipes as the
    lines read before: communicate() would miss what they already buffered)."""
    proc.wait(timeout=60)
    return proc.stdout.read(), proc.stderr.read()


def test_nowebui_keeps_serving_after_the_web_uis_main_returns_and_stops_with_it():
    """The web UI's main returns right after loading extensions when --nowebui is given without
    its own --api (server.py): the API must keep the process up until the web UI is stopped,
    then stop cleanly, its port freed."""
    proc, port = _start_nowebui()
    try:
        assert proc.stdout.readline().startswith("ready"), proc.stderr.read()
        # printed by the double's main once the interpreter shuts down: main has returned
        assert proc.stdout.readline().strip() == "main returned"
        base = f"http://127.0.0.1:{port}/v1"
        r = httpx.post(f"{base}/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "Hi"}], "stream": True})
        chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) \
            == "Hello, world!"
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)   # Ctrl+C: the web UI's signal handler calls sys.exit(0)
        out, err = _ended(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert "stopped" in out
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))   # the port was given back


def test_nowebui_with_the_web_uis_api_leaves_the_process_to_it():
    """With --api the web UI's own API blocks its main: the extension must not hold the process
    once that has returned (there, as the web UI stopped)."""
    proc, port = _start_nowebui(api=True)
    try:
        assert proc.stdout.readline().startswith("ready"), proc.stderr.read()
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).status_code == 200
        os.kill(proc.pid, signal.SIGTERM)   # ends the double's built-in API, so its main returns
        out, err = _ended(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "main returned" in out


# --- the folder's name --------------------------------------------------------------------------------

@pytest.mark.parametrize("module", ["user_ext_openai", "extensions.openai.script"])
def test_a_reserved_folder_name_is_told_in_one_line(host_modules, web_ui_logging, monkeypatch, module):
    """`--extensions openai` turns the web UI's built-in API on instead of loading a folder of
    that name: an extension that still finds itself loaded as 'openai' (an older web UI) says so."""
    import importlib.util

    host_modules.shared.settings["openai-port"] = free_port()
    spec = importlib.util.spec_from_file_location(module, ROOT / "script.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    ext.params["port"] = host_modules.shared.settings["openai-port"]
    ext.setup()
    try:
        lines = [line for line in console(host_modules) if "reserve" in line]
        assert len(lines) == 1 and "openai_ext" in lines[0] and "\n" not in lines[0], console(host_modules)
        assert ext.server is not None   # it still serves
    finally:
        ext.server.stop()


def test_the_extensions_own_name_is_the_one_the_web_ui_loaded_it_by(host_modules, web_ui_logging):
    from support.webui import import_extension

    assert import_extension("my_api").NAME == "my_api"
    host_modules.shared.settings["my_api-port"] = "not a port"
    load_extension(host_modules.shared, "my_api")
    lines = [line for line in console(host_modules) if "not started" in line]
    assert len(lines) == 1 and "'my_api-<setting>" in lines[0] and "reserve" not in " ".join(console(host_modules))


def test_nothing_suggests_the_reserved_name():

    for path in ("script.py", "README.md", "openai_ext/extension.py"):
        text = (ROOT / path).read_text()
        assert "openai-port" not in text and "--extensions openai " not in text and "extensions/openai/" not in text, path


def test_the_web_uis_public_api_is_not_a_second_tunnel(host_modules, web_ui_logging, monkeypatch):
    """The web UI's --public-api starts its built-in API with its own tunnel (port 5000): the
    extension must not open another for the same flag; its own public_api setting does that."""
    from openai_ext.core import tunnel

    opened = []
    monkeypatch.setattr(tunnel, "_open", lambda settings, port: opened.append(port))
    shared = host_modules.shared
    shared.args.public_api, shared.args.api_key = True, "k"
    shared.settings["openai_ext-port"] = free_port()
    ext = load_extension(shared)
    try:
        assert ext.server is not None and not ext.server.settings.public_api and opened == []
    finally:
        ext.server.stop()
    shared.settings.update({"openai_ext-port": free_port(), "openai_ext-public_api": True})
    ext = load_extension(shared)
    try:
        tunnel_thread = [t for t in __import__("threading").enumerate() if t.name == "public-tunnel"]
        for t in tunnel_thread:
            t.join(5)
        assert opened == [ext.server.port]   # asked for by its own setting: one tunnel, to this API
    finally:
        ext.server.stop()
