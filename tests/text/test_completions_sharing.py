"""A completions request with many prompts is bounded (the max_prompts setting) and shares the
batch: on a host that runs several generations at once, its choices take more than one lane only
while nobody waits in line, and a client that comes meanwhile gets a lane at the next choice
boundary. On the scripted host; order is asserted through events, never through timers."""

from __future__ import annotations

import concurrent.futures
import threading

import httpx
import openai
import pytest
from support.servers import idle, wait_until
from support.spec import error_of


def test_more_prompts_than_max_prompts_is_a_400_before_any_is_tokenized(scripted, sclient, monkeypatch):
    limit = scripted.app.state.api.text.settings.max_prompts
    tokenized = []
    real = scripted.app.state.api.text.host.tokenize
    monkeypatch.setattr(scripted.app.state.api.text.host, "tokenize",
                        lambda text, **kw: tokenized.append(text) or real(text, **kw))
    for prompt in (["Say hi."] * (limit + 1), [[1, 2, 3]] * (limit + 1), ["x"] * 10_000):
        with pytest.raises(openai.BadRequestError) as e:
            sclient.completions.create(model="x", prompt=prompt, max_tokens=1)
        err = e.value.body
        assert err["param"] == "prompt" and str(limit) in err["message"] and "max_prompts" in err["message"]
    assert tokenized == []
    r = httpx.post(f"{scripted.url}/completions", json={"model": "x", "prompt": ["a"] * (limit + 1)}, timeout=30)
    error_of(r, 400)
    # at the limit, every prompt is answered
    done = sclient.completions.create(model="x", prompt=[f"Prompt {i}" for i in range(limit)], max_tokens=2)
    assert [c.index for c in done.choices] == list(range(limit))


class Gated:
    """The host's generations, each held at its start until its gate opens (by the last word
    of its prompt); records which started, in order, and how many ran at once at most."""

    def __init__(self, host, monkeypatch):
        self.gates: dict[str, threading.Event] = {}
        self.started: list[str] = []
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()
        real = host.generate

        def generate(prompt, settings, stop_event):
            name = prompt.text.split()[-1] if "<|im_start|>" not in prompt.text else "B"
            with self.lock:
                self.started.append(name)
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                gate = self.gates.get(name)
                while gate is not None and not gate.wait(0.01):
                    if stop_event.is_set():
                        return
                yield from real(prompt, settings, stop_event)
            finally:
                with self.lock:
                    self.running -= 1
        monkeypatch.setattr(host, "generate", generate)


def test_a_waiting_client_gets_a_lane_at_the_next_choice_boundary(scripted, script, monkeypatch):
    script.with_abilities(parallel=2)
    script.default = lambda prompt: "done " + (prompt.text.split()[-1] if "<|im_start|>" not in prompt.text
                                               else "B")
    gated = Gated(script, monkeypatch)
    gated.gates = {"A0": threading.Event(), "A1": threading.Event()}
    queue = scripted.app.state.api.text.queue
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        many = pool.submit(httpx.post, f"{scripted.url}/completions", timeout=60, json={
            "model": "x", "prompt": ["A0", "A1", "A2", "A3"], "max_tokens": 4})
        # alone in line, the request runs two choices at once: its place and one more
        wait_until(lambda: sorted(gated.started) == ["A0", "A1"], "two choices running together")
        assert queue.running == 2 and queue.waiting == 0
        other = pool.submit(httpx.post, f"{scripted.url}/chat/completions", timeout=60, json={
            "model": "x", "messages": [{"role": "user", "content": "B"}], "max_tokens": 4})
        wait_until(lambda: queue.waiting == 1, "the other client waiting in line")
        assert "B" not in gated.started
        # one choice ends: its lane goes to the waiting client, not to the next prompt
        gated.gates["A1"].set()
        answer = other.result()
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "done B"
        assert gated.started[2] == "B" and "A2" not in gated.started   # A0 still holds the request's own lane
        gated.gates["A0"].set()
        r = many.result()
    finally:
        for gate in gated.gates.values():
            gate.set()
        pool.shutdown()
    assert r.status_code == 200
    # the results keep their order, whoever ran when
    assert [(c["index"], c["text"]) for c in r.json()["choices"]] == [(i, f"done A{i}") for i in range(4)]
    assert sorted(gated.started) == ["A0", "A1", "A2", "A3", "B"] and gated.most <= 2
    assert idle(scripted, script)
