"""Legacy routes, and the real legacy client (openai 0.28) configured the old way, run in its own
virtual environment because it cannot live beside the current client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from openai_spec import assert_valid

HERE = Path(__file__).parent
LEGACY_VENV = HERE / ".legacy-venv"


@pytest.fixture(scope="session")
def legacy_python() -> Path:
    python = LEGACY_VENV / "bin" / "python"
    ready = python.exists() and subprocess.run([str(python), "-c", "import openai, numpy"]).returncode == 0
    if not ready:
        subprocess.run([sys.executable, "-m", "venv", str(LEGACY_VENV)], check=True)
        # numpy: the 0.28 client decodes base64 embeddings with it (its "datalib" extra)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "openai==0.28.1", "numpy"], check=True)
    return python


def test_engines_routes(live, llama_host):
    engines = httpx.get(f"{live.url}/engines").json()
    assert engines["object"] == "list"
    assert llama_host.model_id in [e["id"] for e in engines["data"]]
    one = httpx.get(f"{live.url}/engines/{llama_host.model_id}").json()
    assert one["object"] == "engine" and one["ready"] is True
    missing = httpx.get(f"{live.url}/engines/nope")
    assert missing.status_code == 404
    assert_valid("ErrorResponse", missing.json())
    r = httpx.post(f"{live.url}/engines/davinci/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert_valid("CreateCompletionResponse", r.json())
    r = httpx.post(f"{live.url}/engines/gpt-4/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert_valid("CreateChatCompletionResponse", r.json())
    # ids with a slash (org/model) reach the right route
    r = httpx.post(f"{live.url}/engines/org/some-model/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.json()["object"] == "chat.completion"
    r = httpx.post(f"{live.url}/engines/org/some-model/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.json()["object"] == "text_completion"


def test_edits_shape(live):
    r = httpx.post(f"{live.url}/edits", timeout=60,
                   json={"model": "x", "input": "I has a apple.", "instruction": "Fix the grammar.", "n": 2,
                         "temperature": 0})
    body = r.json()
    assert body["object"] == "edit" and [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["text"] and body["usage"]["total_tokens"] > 0
    bad = httpx.post(f"{live.url}/edits", json={"input": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "instruction"


def test_the_real_legacy_client(live, llama_host, legacy_python):
    env = {**os.environ, "OPENAI_API_BASE": live.url, "OPENAI_API_KEY": "dummy"}
    env.pop("OPENAI_BASE_URL", None)
    run = subprocess.run([str(legacy_python), str(HERE / "legacy_client_script.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["api_base"] == live.url
    assert llama_host.model_id in out["models"] and llama_host.model_id in out["engines"]
    assert out["completion"]["text"] and out["completion"]["finish"] == "length" and out["completion"]["usage"] == 5
    assert out["engine_completion"] == out["completion"]["text"]
    assert out["chat"]["role"] == "assistant" and out["chat"]["content"]
    assert out["chat_stream"] == out["chat"]["content"]
    assert out["embedding"]["n"] == 2 and out["embedding"]["dims"] == 384
    assert out["edit"]["object"] == "edit" and out["edit"]["text"]
    assert out["error"]["status"] == 400 and out["error"]["param"] == "messages"
