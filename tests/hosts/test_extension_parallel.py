"""Concurrency that follows the web UI: on a loader that serves parallel slots (llama.cpp with
--parallel N above 1) up to N API requests generate at once, as the web UI's generate_reply then
skips its generation lock; elsewhere one at a time. The queue still bounds the rest, in order."""

from __future__ import annotations

import threading

import httpx
import pytest
from support.spec import assert_valid_stream


@pytest.fixture
def traced(host_modules):
    """Records each token the double's llama.cpp model generates, as (prompt's last word, step,
    whether the host's generation lock was held), and how many generations ran at once."""
    tg = host_modules.text_generation
    tg.SCRIPT = [f" t{i}" for i in range(12)]
    events, running, lock = [], [0], threading.Lock()
    most = [0]
    original = tg.LlamaServer.generate_with_streaming
    barrier: list[threading.Barrier | None] = [None]

    def generate_with_streaming(self, prompt, state):
        tag = prompt.rsplit("user\n", 1)[-1].split("<", 1)[0]
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            for step, text in enumerate(original(self, prompt, state)):
                events.append((tag, step, host_modules.shared.generation_lock.locked()))
                if step == 0 and barrier[0] is not None:
                    barrier[0].wait(timeout=20)   # both generations are under way at once
                yield text
        finally:
            with lock:
                running[0] -= 1

    tg.LlamaServer.generate_with_streaming = generate_with_streaming
    yield events, most, barrier
    tg.LlamaServer.generate_with_streaming = original


def stream(url: str, word: str, results: dict, **extra) -> None:
    r = httpx.post(f"{url}/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": word}], "stream": True, "max_tokens": 50, **extra})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    results[word] = (chunks, "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]))


def run_together(url: str, words: list[str], **extra) -> dict:
    results: dict = {}
    threads = [threading.Thread(target=stream, args=(url, w, results), kwargs=extra) for w in words]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_streams_interleave_on_parallel_slots(extension, host_modules, traced):
    events, most, barrier = traced
    host_modules.shared.args.parallel = 2
    barrier[0] = threading.Barrier(2)
    results = run_together(extension.server.url, ["alpha", "beta"])
    expected = "".join(host_modules.text_generation.SCRIPT)
    assert results["alpha"][1] == expected and results["beta"][1] == expected
    tags = [tag for tag, _, _ in events]
    # each generation's first token came before the other's last one: they ran side by side
    assert tags.index("beta") < len(tags) - 1 - tags[::-1].index("alpha")
    assert tags.index("alpha") < len(tags) - 1 - tags[::-1].index("beta")
    assert most[0] == 2 and not any(locked for _, _, locked in events)   # the host's lock was skipped


def test_one_at_a_time_without_parallel_slots(extension, host_modules, traced):
    events, most, _ = traced
    results = run_together(extension.server.url, ["alpha", "beta"])
    assert all(text == "".join(host_modules.text_generation.SCRIPT) for _, text in results.values())
    tags = [tag for tag, _, _ in events]
    first = tags[0]
    assert tags == [first] * 12 + [t for t in ("alpha", "beta") if t != first] * 12   # one after the other
    assert most[0] == 1 and all(locked for _, _, locked in events)   # under the host's lock


def test_no_more_than_the_slots_run_at_once(extension, host_modules, traced):
    events, most, _ = traced
    host_modules.shared.args.parallel = 2
    results = run_together(extension.server.url, ["alpha", "beta", "gamma", "delta"])
    assert len(results) == 4 and most[0] <= 2


def test_a_generation_with_logprobs_runs_alone(extension, host_modules, traced):
    """The llama.cpp loader keeps the log-probabilities of one generation in one attribute of
    the model: a generation that reads them must not share the model."""
    events, most, _ = traced
    host_modules.shared.args.parallel = 2
    results = run_together(extension.server.url, ["alpha", "beta", "gamma"], logprobs=True)
    for chunks, text in results.values():
        listed = [c["token"] for ch in chunks if ch["choices"] for c in (ch["choices"][0]["logprobs"] or {})
                  .get("content") or []]
        assert "".join(listed) == text == "".join(host_modules.text_generation.SCRIPT)
    tags = [tag for tag, _, _ in events]
    runs = [tag for i, tag in enumerate(tags) if i == 0 or tags[i - 1] != tag]
    assert sorted(runs) == ["alpha", "beta", "gamma"] and most[0] == 1   # never interleaved


def test_a_model_change_waits_until_nothing_runs(extension, host_modules, traced):
    """A slot is free, but a generation runs: the model is changed only once it has ended."""
    events, most, barrier = traced
    host_modules.shared.args.parallel = 2
    host_modules.text_generation.SCRIPT = [f" t{i}" for i in range(400)]   # long enough to be overtaken
    barrier[0] = threading.Barrier(2)
    models = host_modules.models
    original = models.load_model

    def load_model(name, loader=None):
        events.append(("load", 0, False))
        return original(name, loader)
    models.load_model = load_model
    loaded = {}

    def change():
        barrier[0].wait(timeout=20)   # the generation is under way
        loaded["status"] = httpx.post(f"{extension.server.url}/internal/model/load", timeout=60,
                                      json={"model_name": "Other-Model-3B-Instruct.Q5_K_M.gguf"}).status_code
    changer = threading.Thread(target=change)
    changer.start()
    results = run_together(extension.server.url, ["alpha"], max_tokens=400)
    changer.join()
    assert loaded["status"] == 200 and results["alpha"][1] == "".join(host_modules.text_generation.SCRIPT)
    tags = [tag for tag, _, _ in events]
    assert tags == ["alpha"] * 400 + ["load"]   # after the generation ended
