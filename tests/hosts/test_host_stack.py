"""The extension inside the web UI's own environment: the web UI pins its web stack (fastapi
0.112.4 with starlette 0.38, pydantic 2.11, sse-starlette 1.6.5). Installing requirements.txt
there, as the README says, must leave those pins alone, and the extension must serve on them.

A virtual environment with the web UI's pins is made once (tests/.host-stack-venv); the
extension then runs in it on the double of the web UI's `modules`, driven by the official client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import ROOT
from support.spec import assert_valid, assert_valid_stream

pytestmark = pytest.mark.network

HERE = Path(__file__).parent
VENV = HERE / ".host-stack-venv"
# The web stack text-generation-webui pins in requirements/full/requirements.txt.
HOST_PINS = ["fastapi==0.112.4", "pydantic==2.11.0", "sse-starlette==1.6.5"]


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True, timeout=900)


@pytest.fixture(scope="session")
def host_python() -> Path:
    python = VENV / "bin" / "python"
    marker = VENV / "installed.txt"
    wanted = (ROOT / "requirements.txt").read_text() + "\n".join(HOST_PINS)
    if not (python.exists() and marker.exists() and marker.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        _pip(python, *HOST_PINS)                                   # the web UI, as installed
        _pip(python, "-r", str(ROOT / "requirements.txt"))  # then this extension, as the README says
        marker.write_text(wanted)
    return python


def test_installing_the_extension_keeps_the_web_uis_pins(host_python):
    check = subprocess.run([str(host_python), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    freeze = subprocess.run([str(host_python), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    installed = {line.split("==")[0].lower(): line.split("==")[1] for line in freeze.splitlines() if "==" in line}
    assert installed["fastapi"] == "0.112.4" and installed["pydantic"] == "2.11.0"
    assert installed["starlette"].startswith("0.38.")


@pytest.fixture(scope="module")
def on_host_stack(host_python):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(host_python), str(HERE / "host_stack_serve.py"), str(port)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    yield f"http://127.0.0.1:{port}/v1", json.loads(line.split(" ", 2)[2])
    proc.stdin.close()
    proc.wait(timeout=30)


def test_the_extension_serves_on_the_web_uis_stack(on_host_stack):
    from openai import OpenAI

    url, versions = on_host_stack
    assert versions["fastapi"] == "0.112.4" and versions["starlette"].startswith("0.38.")
    client = OpenAI(base_url=url, api_key="x", max_retries=0, _strict_response_validation=True, timeout=30)
    assert client.models.list().data[0].id == "Double-Model-1B-Instruct.Q4_K_M.gguf"
    raw = client.chat.completions.with_raw_response.create(model="x", messages=[{"role": "user", "content": "Hi"}])
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    assert raw.parse().choices[0].message.content == "Hello, world!"
    stream = httpx.post(f"{url}/chat/completions", timeout=30,
                        json={"messages": [{"role": "user", "content": "Hi"}], "stream": True})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", stream.text)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello, world!"
    bad = httpx.post(f"{url}/chat/completions", json={"messages": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
