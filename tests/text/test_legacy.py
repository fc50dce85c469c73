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
from support.spec import assert_valid

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


def test_engines_routes(scripted, scripted_host):
    engines = httpx.get(f"{scripted.url}/engines").json()
    assert engines["object"] == "list"
    assert scripted_host.model_id in [e["id"] for e in engines["data"]]
    one = httpx.get(f"{scripted.url}/engines/{scripted_host.model_id}").json()
    assert one["object"] == "engine" and one["ready"] is True
    missing = httpx.get(f"{scripted.url}/engines/nope")
    assert missing.status_code == 404
    assert_valid("ErrorResponse", missing.json())
    r = httpx.post(f"{scripted.url}/engines/davinci/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert_valid("CreateCompletionResponse", r.json())
    r = httpx.post(f"{scripted.url}/engines/gpt-4/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert_valid("CreateChatCompletionResponse", r.json())
    # ids with a slash (org/model) reach the right route
    r = httpx.post(f"{scripted.url}/engines/org/some-model/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.json()["object"] == "chat.completion"
    r = httpx.post(f"{scripted.url}/engines/org/some-model/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.json()["object"] == "text_completion"


def test_edits_shape(scripted):
    r = httpx.post(f"{scripted.url}/edits", timeout=60,
                   json={"model": "x", "input": "I has a apple.", "instruction": "Fix the grammar.", "n": 2,
                         "temperature": 0})
    body = r.json()
    assert body["object"] == "edit" and [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["text"] and body["usage"]["total_tokens"] > 0
    bad = httpx.post(f"{scripted.url}/edits", json={"input": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "instruction"


@pytest.mark.network
@pytest.mark.engines  # the legacy client asks for embeddings too
def test_the_real_legacy_client(scripted, scripted_host, legacy_python):
    env = {**os.environ, "OPENAI_API_BASE": scripted.url, "OPENAI_API_KEY": "dummy"}
    env.pop("OPENAI_BASE_URL", None)
    run = subprocess.run([str(legacy_python), str(HERE / "legacy_client_script.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["api_base"] == scripted.url
    assert scripted_host.model_id in out["models"] and scripted_host.model_id in out["engines"]
    assert out["completion"]["text"] and out["completion"]["finish"] == "length" and out["completion"]["usage"] == 5
    assert out["engine_completion"] == out["completion"]["text"]
    assert out["chat"]["role"] == "assistant" and out["chat"]["content"]
    assert out["chat_stream"] == out["chat"]["content"]
    assert out["embedding"]["n"] == 2 and out["embedding"]["dims"] == 384
    assert out["edit"]["object"] == "edit" and out["edit"]["text"]
    assert out["error"]["status"] == 400 and out["error"]["param"] == "messages"


@pytest.mark.engines   # loads the embedding model behind the legacy engines route
def test_engine_embeddings_are_the_embeddings_of_the_input(scripted):
    inputs = ["hello world", "goodbye"]
    r = httpx.post(f"{scripted.url}/engines/text-embedding-ada-002/embeddings", json={"input": inputs}, timeout=120)
    assert r.status_code == 200, r.text
    assert_valid("CreateEmbeddingResponse", r.json())
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1] and len(data[0]["embedding"]) == 384
    # the same vectors the modern route gives for the same input
    modern = httpx.post(f"{scripted.url}/embeddings", json={"input": inputs, "model": "text-embedding-ada-002"}, timeout=120).json()["data"]
    assert [d["embedding"] for d in data] == [d["embedding"] for d in modern]
    # an engine id with a slash reaches the route too
    r = httpx.post(f"{scripted.url}/engines/sentence-transformers/all-MiniLM-L6-v2/embeddings", json={"input": "hi"},
                   timeout=120)
    assert r.status_code == 200 and len(r.json()["data"]) == 1
    assert httpx.post(f"{scripted.url}/engines/org/embedder/embeddings", json={"input": "hi"}).status_code == 404


def test_engine_edits(scripted):
    for engine in ("text-davinci-edit-001", "org/editor"):
        r = httpx.post(f"{scripted.url}/engines/{engine}/edits", timeout=60,
                       json={"input": "I has a apple.", "instruction": "Fix the grammar.", "temperature": 0})
        body = r.json()
        assert r.status_code == 200 and body["object"] == "edit", (engine, body)
        assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] > 0
    bad = httpx.post(f"{scripted.url}/engines/x/edits", json={"input": "no instruction"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "instruction"


def test_edits_in_extension_mode_go_through_the_hosts_instruction_template(host_modules, make_server):
    from openai_ext.hosts.textgen import TextgenHost

    server = make_server(TextgenHost(host_modules))
    r = httpx.post(f"{server.url}/edits", timeout=30,
                   json={"model": "text-davinci-edit-001", "input": "I has a apple.",
                         "instruction": "Fix the grammar."})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "edit" and r.json()["choices"][0]["text"] == "Hello, world!"
    # one user turn, instruction then input, rendered by the host's own prompt builder ...
    user_input, state = host_modules.chat.CALLS[-1]
    assert user_input == "Fix the grammar.\n\nI has a apple."
    assert state["instruction_template_str"] == host_modules.shared.settings["instruction_template_str"]
    # ... into the prompt the host generated from
    question = host_modules.text_generation.CALLS[-1][0]
    assert question == "<|im_start|>user\nFix the grammar.\n\nI has a apple.<|im_end|>\n<|im_start|>assistant\n"
