"""The extension inside the web UI's own environment. The web UI pins its packages
(requirements/full/requirements.txt at text-generation-webui bde878f); installing this
extension's requirements.txt there, as the README says, must change none of those pins, and the
extension must serve on them, beside the web UI's own API in the same process.

A virtual environment with the web UI's pins is made once (tests/hosts/.host-stack-venv); the
extension then runs in it on the double of the web UI's `modules`, driven by the official client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import ROOT
from support.servers import free_port
from support.spec import assert_valid, assert_valid_stream, parse_sse

pytestmark = pytest.mark.network

HERE = Path(__file__).parent
VENV = HERE / ".host-stack-venv"
# The web UI's pins (requirements/full/requirements.txt at bde878f) among the packages this
# extension's requirements reach, and starlette as fastapi 0.112.4 resolves it there.
HOST_PINS = {"fastapi": "0.112.4", "starlette": "0.38.6", "pydantic": "2.11.0", "sse-starlette": "1.6.5",
             "numpy": "2.2.*", "jinja2": "3.1.6", "flask-cloudflared": "0.0.15"}


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True, timeout=1800)


def _installed(python: Path) -> dict[str, str]:
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    return {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
            for line in freeze.splitlines() if "==" in line}


@pytest.fixture(scope="session")
def host_python() -> Path:
    python = VENV / "bin" / "python"
    marker = VENV / "installed.txt"
    pins = [f"{name}=={version}" for name, version in HOST_PINS.items()]
    wanted = (ROOT / "requirements.txt").read_text() + "\n".join(pins)
    if not (python.exists() and marker.exists() and marker.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        _pip(python, *pins)                                 # the web UI, as installed
        before = _installed(python)
        _pip(python, "-r", str(ROOT / "requirements.txt"))  # then this extension, as the README says
        changed = {k: (v, _installed(python).get(k)) for k, v in before.items() if _installed(python).get(k) != v}
        (VENV / "changed.json").write_text(json.dumps(changed))
        marker.write_text(wanted)
    return python


def test_installing_the_extension_changes_none_of_the_web_uis_pins(host_python):
    installed = _installed(host_python)
    for name, version in HOST_PINS.items():
        if version.endswith(".*"):
            assert installed[name].startswith(version[:-1]), (name, installed[name])
        else:
            assert installed[name] == version, (name, installed[name])
    # nothing the web UI had was moved, pinned or not
    assert json.loads((VENV / "changed.json").read_text()) == {}
    check = subprocess.run([str(host_python), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


@pytest.fixture(scope="module")
def on_host_stack(host_python):
    port, builtin_port = free_port(), free_port()
    proc = subprocess.Popen([str(host_python), str(HERE / "host_stack_serve.py"), str(port), str(builtin_port)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    yield f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{builtin_port}/v1", json.loads(line.split(" ", 1)[1])
    proc.stdin.close()
    proc.wait(timeout=30)


def _builtin_stream(url: str) -> str:
    events, done = parse_sse(httpx.post(f"{url}/completions", timeout=30).text)
    assert done
    return "".join(e["choices"][0]["text"] for e in events)


def test_the_extension_and_the_web_uis_api_stream_side_by_side(on_host_stack):
    from openai import OpenAI

    url, builtin, versions = on_host_stack
    assert versions["sse-starlette"] == "1.6.5" and versions["starlette"] == "0.38.6"
    # the web UI's own API streams first: sse-starlette 1.x binds its shared event to that loop
    assert _builtin_stream(builtin) == "built-in API"
    client = OpenAI(base_url=url, api_key="x", max_retries=0, _strict_response_validation=True, timeout=30)
    assert client.models.list().data[0].id == "Double-Model-1B-Instruct.Q4_K_M.gguf"
    raw = client.chat.completions.with_raw_response.create(model="x", messages=[{"role": "user", "content": "Hi"}])
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    assert raw.parse().choices[0].message.content == "Hello, world!"
    for _ in range(2):   # this extension's streams, then the web UI's again
        stream = httpx.post(f"{url}/chat/completions", timeout=30,
                            json={"messages": [{"role": "user", "content": "Hi"}], "stream": True})
        chunks = assert_valid_stream("CreateChatCompletionStreamResponse", stream.text)
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) \
            == "Hello, world!"
        assert _builtin_stream(builtin) == "built-in API"
    with client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                        stream=True) as events:
        assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == "Hello, world!"
    bad = httpx.post(f"{url}/chat/completions", json={"messages": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
