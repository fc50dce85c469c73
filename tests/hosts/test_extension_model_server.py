"""The web UI's llama.cpp loader runs llama-server in a process of its own. When that process dies
under the extension's request (on a CPU whose AMX path crashes llama.cpp, the first prompt kills
it with SIGSEGV), the request gets a 503 naming what happened and what to do, never a hang, an
empty reply or a 500; so does every request until the model is loaded again, and then it works
without restarting anything. The double's llama-server is a real child process, killed here with
a real signal."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest
from support.spec import assert_valid

pytestmark = pytest.mark.usefixtures("host_modules")


def server_process(host_modules):
    return host_modules.shared.model.process


def kill(host_modules, sig=signal.SIGSEGV) -> None:
    process = server_process(host_modules)
    process.send_signal(sig)
    process.wait(timeout=10)


def ask(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, **body})


def test_a_dead_model_server_is_a_503_that_says_what_happened(extension, host_modules):
    assert ask(extension.server.url).status_code == 200
    kill(host_modules)
    r = ask(extension.server.url)
    assert r.status_code == 503, r.text
    assert_valid("ErrorResponse", r.json())
    error = r.json()["error"]
    assert error["code"] == "model_server_stopped" and error["type"] == "server_error"
    assert "llama-server" in error["message"] and "SIGSEGV" in error["message"]
    assert "--extra-flags=--no-repack" in error["message"]      # what avoids the AMX crash
    assert "crash with no-repack too" in error["message"]      # and what is left where that is not it
    assert "Traceback" not in r.text
    health = httpx.get(extension.server.url.removesuffix("/v1") + "/health", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "unavailable"
    assert "SIGSEGV" in health.json()["error"]
    # every route that needs the model says the same, at once
    for r in (httpx.post(f"{extension.server.url}/completions", json={"prompt": "Hi", "max_tokens": 5}, timeout=30),
              httpx.post(f"{extension.server.url}/internal/token-count", json={"text": "Hi"}, timeout=30),
              httpx.post(f"{extension.server.url}/messages", json={"model": "x", "max_tokens": 5,
                                                            "messages": [{"role": "user", "content": "Hi"}]},
                         timeout=30)):
        assert r.status_code == 503 and "llama-server" in r.text, r.text


def test_a_stream_whose_model_server_dies_ends_with_an_error_event(extension, host_modules):
    tg = host_modules.text_generation
    tg.SCRIPT = [f" w{i}" for i in range(40)]
    tg.TOKEN_SECONDS = 0.01
    events = []
    with httpx.stream("POST", f"{extension.server.url}/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 40}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                threading.Thread(target=kill, args=(host_modules,)).start()
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "model_server_stopped" and "while generating this reply" in error["message"]
    assert "SIGSEGV" in error["message"]


def test_a_server_that_exited_is_told_without_crash_advice(extension, host_modules):
    kill(host_modules, signal.SIGTERM)
    r = ask(extension.server.url)
    assert r.status_code == 503
    message = r.json()["error"]["message"]
    assert "killed by SIGTERM" in message and "no-repack" not in message and "Load the model again" in message


def test_once_the_web_ui_loads_the_model_again_requests_work_again(extension, host_modules):
    kill(host_modules)
    assert ask(extension.server.url).status_code == 503
    shared = host_modules.shared
    shared.model, shared.tokenizer = host_modules.models.load_model(shared.model_name, loader="llama.cpp")
    r = ask(extension.server.url)
    assert r.status_code == 200, r.text
    assert_valid("CreateChatCompletionResponse", r.json())
    assert httpx.get(extension.server.url.removesuffix("/v1") + "/health", timeout=10).status_code == 200


def test_a_loader_without_a_server_process_is_not_affected(extension, host_modules):
    shared = host_modules.shared
    shared.model, shared.tokenizer = host_modules.models.load_model(shared.model_name, loader="Transformers")
    assert not hasattr(shared.model, "process")
    assert ask(extension.server.url).status_code == 200
