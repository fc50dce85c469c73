"""Queueing, disconnects and responsiveness on the real embedded model."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from support.pieces import hook_pieces

pytestmark = pytest.mark.slow


@pytest.fixture
def recorded(llama_host, monkeypatch):
    """Records when the real host produces each piece, and the order generations start in."""
    log = {"pieces": [], "starts": []}
    hook_pieces(llama_host, monkeypatch, start=lambda prompt: log["starts"].append(prompt.text),
                piece=lambda i, p: log["pieces"].append(time.monotonic()))
    return log


LONG = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 2000, "temperature": 0}


def wait_idle(live, host, timeout=5.0):
    state = live.app.state.api
    deadline = time.monotonic() + timeout
    while (state.text.queue.running or not host.idle()) and time.monotonic() < deadline:
        time.sleep(0.005)
    return not state.text.queue.running and host.idle()


def test_disconnect_mid_stream_stops_within_a_token_or_two(live, llama_host, recorded):
    body = {**LONG, "stream": True}
    with httpx.stream("POST", f"{live.url}/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(12):
            next(lines)
    closed = time.monotonic()
    assert wait_idle(live, llama_host), "the generation did not stop and free the lock"
    after = [t for t in recorded["pieces"] if t > closed]
    assert len(after) <= 2, f"{len(after)} tokens were generated after the client left"
    assert len(recorded["pieces"]) < 200
    ok = httpx.post(f"{live.url}/chat/completions", json={"messages": LONG["messages"], "max_tokens": 3},
                    timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_disconnect_during_a_non_streaming_request_stops_it(live, llama_host, recorded):
    body = dict(LONG)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{live.url}/chat/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    closed = time.monotonic()
    assert wait_idle(live, llama_host)
    after = [t for t in recorded["pieces"] if t > closed]
    assert len(after) <= 2, f"{len(after)} tokens were generated after the client left"
    assert len(recorded["pieces"]) < 200


def test_generations_run_one_at_a_time_first_come_first_served(live, llama_host, recorded, monkeypatch):
    from openai_ext.text import completions

    arrivals = []
    real_prepare = completions.prepare

    def prepare(state, req):   # records the order requests reach the server
        arrivals.append(req.prompt)
        return real_prepare(state, req)
    monkeypatch.setattr(completions, "prepare", prepare)
    results = {}

    def ask(i):
        r = httpx.post(f"{live.url}/completions", json={"prompt": f"Request number {i}:", "max_tokens": 12,
                                                       "temperature": 0}, timeout=60)
        results[i] = r.status_code

    threads = []
    for i in range(4):
        t = threading.Thread(target=ask, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(0.03)   # arrival order 0, 1, 2, 3
    for t in threads:
        t.join()
    assert results == {0: 200, 1: 200, 2: 200, 3: 200}
    assert sorted(arrivals) == [f"Request number {i}:" for i in range(4)]
    assert recorded["starts"] == arrivals


def test_models_and_health_respond_while_generating(live, llama_host, recorded):
    body = {**LONG, "max_tokens": 300}
    t = threading.Thread(target=lambda: httpx.post(f"{live.url}/chat/completions", json=body, timeout=60))
    t.start()
    try:
        deadline = time.monotonic() + 5
        while not live.app.state.api.text.queue.running and time.monotonic() < deadline:
            time.sleep(0.005)
        assert live.app.state.api.text.queue.running == 1
        tokens_before = len(recorded["pieces"])
        assert httpx.get(f"{live.url}/models", timeout=5).status_code == 200
        health = httpx.get(f"{live.url.removesuffix('/v1')}/health", timeout=5).json()
        # answered while the generation ran on: it was still running, and still making tokens
        assert health["model_loaded"] and health["running"] == 1
        assert live.app.state.api.text.queue.running == 1 and len(recorded["pieces"]) < 300
        assert tokens_before < 300
    finally:
        t.join()
