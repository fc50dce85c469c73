"""Continuous batching in the embedded llama.cpp host: several requests decode together, each as
its own sequence with its own sampling, and what a request gets does not depend on its company.

Order is asserted through events (which stream got what before which), never through timers."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import uuid

import httpx
import jsonschema
import pytest
from support.pieces import hook_pieces
from support.servers import openai_client
from support.spec import assert_valid

from openai_ext.hosts.base import Prompt
from openai_ext.hosts.request import GenerationSettings

pytestmark = pytest.mark.slow

LONG = "Write a very long story about a dragon and a baker."
GREEDY = GenerationSettings(max_new_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def batch_host():
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    host = LlamaCppHost(default_gguf(), n_ctx=8192, parallel=8)
    yield host
    host.close()


@pytest.fixture(scope="module")
def batched(batch_host, make_server):
    return make_server(batch_host)


def until(condition, what: str, timeout: float = 60.0) -> None:
    """Waits for a state the server exposes (a synchronisation, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.005)


def prompt(host, text: str) -> Prompt:
    rendered = host.chat_prompt([{"role": "user", "content": text}]).text
    return Prompt(rendered, host.tokenize(rendered))


def generate(host, text: str, settings: GenerationSettings, stop: threading.Event | None = None) -> list:
    return list(host.generate(prompt(host, text), settings, stop or threading.Event()))


def running(host) -> int:
    return host.batch_stats()["running"]


class Log:
    """Events of several clients, in the one order they happened in."""

    def __init__(self):
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.first = {}

    def add(self, who: str, what: str) -> None:
        with self._lock:
            self.events.append((who, what))
            self.first.setdefault((who, what), len(self.events) - 1)

    def index(self, who: str, what: str) -> int:
        return self.first[(who, what)]

    def last(self, who: str, what: str) -> int:
        return max(i for i, e in enumerate(self.events) if e == (who, what))


def stream(server, who: str, log: Log, body: dict, *, cut_after: int | None = None) -> list[dict]:
    """Streams a chat request, validating every chunk against OpenAI's spec, noting each token."""
    chunks = []
    with httpx.stream("POST", f"{server.url}/chat/completions", timeout=300,
                      json={"model": "x", "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                log.add(who, "done")
                break
            chunk = json.loads(line[6:])
            assert_valid("CreateChatCompletionStreamResponse", chunk)
            chunks.append(chunk)
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    log.add(who, "token")
                    log.add(who, f"token {choice['index']}")
                if choice.get("finish_reason"):
                    log.add(who, f"finish {choice['index']}")
            if cut_after is not None and len(chunks) >= cut_after:
                log.add(who, "left")
                break
    return chunks


def in_thread(fn, *args, **kwargs) -> concurrent.futures.Future:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args, **kwargs)
    pool.shutdown(wait=False)
    return future


def test_two_streams_interleave(batched, batch_host):
    log = Log()
    body = {"max_tokens": 60, "temperature": 0, "ban_eos_token": True, "stream_options": {"include_usage": True}}
    a = in_thread(stream, batched, "a", log, {**body, "messages": [{"role": "user", "content": LONG}]})
    until(lambda: ("a", "token") in log.first, "a's first token")
    b = in_thread(stream, batched, "b", log, {**body, "messages": [{"role": "user", "content": "Tell me about bees."}]})
    a_chunks, b_chunks = a.result(), b.result()
    # b got tokens before a finished, and a got tokens after b's first one: neither waited for the other
    assert log.index("b", "token") < log.index("a", "done")
    assert log.last("a", "token") > log.index("b", "token")
    assert a_chunks[-1]["usage"]["completion_tokens"] == b_chunks[-1]["usage"]["completion_tokens"] == 60


def test_health_counts_the_requests_that_run_together(batched, batch_host):
    log = Log()
    body = {"max_tokens": 80, "temperature": 0, "ban_eos_token": True}
    futures = [in_thread(stream, batched, who, log, {**body, "messages": [{"role": "user", "content": f"{LONG} {who}"}]})
               for who in ("a", "b")]
    until(lambda: ("a", "token") in log.first and ("b", "token") in log.first, "both streaming")
    health = httpx.get(f"{batched.url.removesuffix('/v1')}/health", timeout=10).json()
    seen = len(log.events)
    assert health["running"] == 2 and health["queued"] == 0
    assert health["sequences"] == {"running": 2, "waiting": 0, "slots": 8}   # none waiting for cells
    for f in futures:
        f.result()
    assert ("a", "done") not in log.events[:seen] and ("b", "done") not in log.events[:seen]


def test_a_seeded_request_gives_the_same_text_again_on_one_sequence(llama_host):
    """With one sequence (parallel 1) the cache holds nothing but that sequence's own cells, laid
    out as they were the first time: a seeded request is reproducible, even after other requests."""
    seeded = GREEDY.replace(temperature=0.9, top_p=0.95, seed=1234, max_new_tokens=40)
    question = "Describe a walk in the forest."
    first = "".join(p.text for p in generate(llama_host, question, seeded))
    generate(llama_host, f"{LONG} Chapter 1.", GREEDY.replace(max_new_tokens=60))
    assert "".join(p.text for p in generate(llama_host, question, seeded)) == first


def assert_same_greedy_answer(alone: list, other: list, tie: float = 0.5) -> None:
    """Two greedy answers (with logprobs 2) to one prompt, one computed alone and one beside other
    sequences, or read again. Their cells lie elsewhere in the shared cache and the attention spans
    more cells, so sums run in another order; the model's activations are quantized to 8 bits, which
    turns such last-bit differences into log-probabilities that differ by up to a few tenths. The
    answers are the same, token for token with log-probabilities within ``tie``, up to a near tie
    between the two best tokens, where such a difference may choose the other one."""
    alone, other = [p for p in alone if p.logprob], [p for p in other if p.logprob]   # (an end has none)
    for i, (a, b) in enumerate(zip(alone, other, strict=False)):
        best, second = a.logprob.top[0][1], a.logprob.top[1][1]
        if a.text != b.text:
            assert best - second < tie, (i, a, b)
            return
        assert abs(a.logprob.logprob - b.logprob.logprob) < tie, (i, a, b)
    assert len(alone) == len(other)


def test_company_changes_a_greedy_answer_only_in_its_last_bits(batch_host):
    settings = GREEDY.replace(max_new_tokens=30, logprobs=2, samplers={"ban_eos_token": True})
    alone = [generate(batch_host, f"List animals, number {i}.", settings) for i in range(4)]
    together = [in_thread(generate, batch_host, f"List animals, number {i}.", settings) for i in range(4)]
    for a, t in zip(alone, together, strict=False):
        assert_same_greedy_answer(a, t.result())


def test_sequences_in_one_cache_never_see_each_others_tokens(batch_host):
    """Each prompt is a list of one word, which the model continues; eight of them at once, each
    with its own word. A sequence that saw another's cells would write the other's word."""
    words = ["apple", "river", "candle", "pencil", "garden", "rocket", "violin", "button"]
    settings = GREEDY.replace(max_new_tokens=6)

    def complete(word):
        text = f"- {word}\n" * 30
        return "".join(p.text for p in batch_host.generate(Prompt(text, batch_host.tokenize(text)), settings,
                                                            threading.Event()))
    futures = {w: in_thread(complete, w) for w in words}
    for word, f in futures.items():
        out = f.result()
        assert word in out and not any(other in out for other in words if other != word), (word, out)


def test_grammar_tools_and_logprobs_work_inside_the_batch(batched, batch_host):
    log = Log()
    long = in_thread(stream, batched, "long", log, {"max_tokens": 400, "temperature": 0, "ban_eos_token": True,
                                                    "messages": [{"role": "user", "content": LONG}]})
    until(lambda: ("long", "token") in log.first, "the long stream started")
    client = openai_client(batched)
    # (a bounded name: sampled at temperature 1, an unbounded one may run past max_tokens)
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

    def ask(who, **kw):
        raw = client.chat.completions.with_raw_response.create(model="x", **kw)
        assert_valid("CreateChatCompletionResponse", raw.http_response.json())
        log.add(who, "done")
        return raw.parse()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        structured = pool.submit(ask, "json", messages=[{"role": "user", "content": "Invent a person."}],
                                 temperature=1.0, seed=3, max_tokens=200, response_format={
                                     "type": "json_schema", "json_schema": {"name": "p", "schema": person}})
        called = pool.submit(ask, "tools", messages=[{"role": "user", "content": "Weather in Paris?"}],
                             tools=[weather], tool_choice="required", temperature=0, max_tokens=100)
        scored = pool.submit(ask, "logprobs", messages=[{"role": "user", "content": "Say hello."}],
                             temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
        free = pool.submit(ask, "free", messages=[{"role": "user", "content": "Name a fruit."}],
                           temperature=0.7, seed=5, max_tokens=20)
        structured, called, scored, free = (f.result() for f in (structured, called, scored, free))
    long.result()
    for who in ("json", "tools", "logprobs", "free"):   # all of them ran while the long one did
        assert log.index(who, "done") < log.index("long", "done")
    assert structured.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(structured.choices[0].message.content), person)
    call = called.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    lp = scored.choices[0].logprobs.content
    assert len(lp) == scored.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in lp)
    assert free.choices[0].message.content


def test_a_reader_that_leaves_frees_its_sequence_within_a_token_and_the_others_finish(batch_host, monkeypatch):
    from openai_ext.hosts import llamacpp

    works = []

    class Recorded(llamacpp.Generation):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            works.append(self)
    monkeypatch.setattr(llamacpp, "Generation", Recorded)
    long = GREEDY.replace(max_new_tokens=150, samplers={"ban_eos_token": True})
    others = [in_thread(generate, batch_host, f"{LONG} Part {i}.", long) for i in range(2)]
    until(lambda: running(batch_host) == 2, "two others running")
    stop = threading.Event()
    pieces = batch_host.generate(prompt(batch_host, "Count to a thousand."), long, stop)
    for _ in range(5):
        next(pieces)
    mine = works[-1]
    stop.set()
    produced_at_stop = mine.produced
    pieces.close()                     # returns once the sequence has left the batch
    assert mine.done and mine.slot is None and running(batch_host) == 2
    assert mine.produced - produced_at_stop <= 1
    assert not any(f.done() for f in others)   # they were still going, and go on to their end
    assert [sum(p.tokens for p in f.result()) for f in others] == [150, 150]


def test_a_client_that_leaves_mid_stream_frees_its_sequence(batched, batch_host):
    log = Log()
    body = {"max_tokens": 150, "temperature": 0, "ban_eos_token": True, "stream_options": {"include_usage": True}}
    other = in_thread(stream, batched, "other", log, {**body, "messages": [{"role": "user", "content": LONG}]})
    until(lambda: ("other", "token") in log.first, "the other stream started")
    stream(batched, "leaver", log, {**body, "messages": [{"role": "user", "content": "Count to a thousand."}]},
           cut_after=5)
    until(lambda: running(batch_host) == 1, "the leaver's sequence freed")
    freed_at = len(log.events)
    chunks = other.result()
    assert ("other", "done") not in log.events[:freed_at]   # freed while the other still ran
    assert chunks[-1]["usage"]["completion_tokens"] == 150


def test_n_choices_run_together_beside_another_client_and_share_the_prompts_cells(batched, batch_host):
    log = Log()
    other = in_thread(stream, batched, "other", log, {"max_tokens": 200, "temperature": 0, "ban_eos_token": True,
                                                      "messages": [{"role": "user", "content": LONG}]})
    until(lambda: ("other", "token") in log.first, "the other stream started")
    before = batch_host.batch_stats()
    system = f"Session {uuid.uuid4().hex}. You are a poet who writes about the sea and its colours. " * 6
    chunks = stream(batched, "n3", log, {"n": 3, "max_tokens": 25, "temperature": 0.9, "seed": 11,
                                         "ban_eos_token": True, "stream_options": {"include_usage": True},
                                         "messages": [{"role": "system", "content": system},
                                                      {"role": "user", "content": "A short poem."}]})
    other.result()
    after = batch_host.batch_stats()
    texts = {i: "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                        if c["choices"] and c["choices"][0]["index"] == i) for i in range(3)}
    assert all(texts.values()) and len(set(texts.values())) == 3     # three choices, each its own seed
    assert chunks[-1]["usage"]["completion_tokens"] == 75
    # they ran together: every choice had tokens before the first of them finished
    first_finish = min(log.index("n3", f"finish {i}") for i in range(3))
    assert all(log.index("n3", f"token {i}") < first_finish for i in range(3))
    assert log.index("n3", "done") < log.index("other", "done")
    # the prompt was read once; the two other choices copied its cells (the first choice may copy
    # too: the chat template's opening tokens, from the other client's cells)
    prompt_len = len(batch_host.tokenize(batch_host.chat_prompt(
        [{"role": "system", "content": system}, {"role": "user", "content": "A short poem."}]).text))
    assert after["copies"] - before["copies"] >= 2
    assert after["reused_tokens"] - before["reused_tokens"] >= 2 * (prompt_len - 1)


def test_the_next_turn_of_a_chat_is_not_read_again(batch_host):
    system = {"role": "system", "content": f"Session {uuid.uuid4().hex}. You answer in one short sentence."}
    turn1 = [system, {"role": "user", "content": "What is the capital of France?"}]
    p1 = prompt_of(batch_host, turn1)
    before = batch_host.batch_stats()
    answer = "".join(p.text for p in batch_host.generate(p1, GREEDY.replace(max_new_tokens=12), threading.Event()))
    middle = batch_host.batch_stats()
    # every prompt token is read or found in the cache (a new session: at most its first few are)
    assert middle["prompt_tokens"] - before["prompt_tokens"] + middle["reused_tokens"] - before["reused_tokens"] \
        == len(p1.tokens)
    p2 = prompt_of(batch_host, turn1 + [{"role": "assistant", "content": answer},
                                        {"role": "user", "content": "And of Italy?"}])
    list(batch_host.generate(p2, GREEDY.replace(max_new_tokens=4), threading.Event()))
    after = batch_host.batch_stats()
    read, reused = after["prompt_tokens"] - middle["prompt_tokens"], after["reused_tokens"] - middle["reused_tokens"]
    assert read + reused == len(p2.tokens)
    assert reused >= len(p1.tokens) and read <= len(p2.tokens) - len(p1.tokens)


def prompt_of(host, messages) -> Prompt:
    rendered = host.chat_prompt(messages).text
    return Prompt(rendered, host.tokenize(rendered))


def test_echo_scores_the_prompt_inside_the_batch(batched, batch_host):
    log = Log()
    other = in_thread(stream, batched, "other", log, {"max_tokens": 100, "temperature": 0, "ban_eos_token": True,
                                                      "messages": [{"role": "user", "content": LONG}]})
    until(lambda: ("other", "token") in log.first, "the other stream started")
    r = httpx.post(f"{batched.url}/completions", timeout=120, json={
        "model": "x", "prompt": "The quick brown fox", "max_tokens": 3, "echo": True, "logprobs": 2,
        "temperature": 0, "n": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert_valid("CreateCompletionResponse", body)
    seen = len(log.events)
    other.result()
    assert ("other", "done") not in log.events[:seen]
    for choice in body["choices"]:
        assert choice["text"].startswith("The quick brown fox")
        lp = choice["logprobs"]
        assert lp["tokens"][:4] == ["The", " quick", " brown", " fox"] and lp["token_logprobs"][0] is not None


def test_a_prompt_longer_than_the_context_is_refused_not_cut(batched, batch_host):
    share = batch_host.context_length()
    assert share == 8192       # the whole context, however many sequences share it
    client = openai_client(batched)
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "word " * (share + 10)}])
    assert e.value.code == "context_length_exceeded" and str(share) in e.value.message


def test_the_line_stays_first_come_first_served_and_bounded(make_server, monkeypatch):
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    host = LlamaCppHost(default_gguf(), n_ctx=1024, parallel=2)
    try:
        server = make_server(host, max_queue=2)
        queue = server.app.state.api.text.queue
        starts = []
        hook_pieces(host, monkeypatch, start=lambda p: starts.append(p.text))

        def ask(name, tokens):
            return httpx.post(f"{server.url}/chat/completions", timeout=300, json={
                "model": "x", "max_tokens": tokens, "temperature": 0, "ban_eos_token": True,
                "messages": [{"role": "user", "content": f"Story {name}"}]})

        sent = []
        futures = {}
        for name, tokens, state in (("r1", 40, lambda: queue.running == 1), ("r2", 80, lambda: queue.running == 2),
                                    ("w1", 10, lambda: queue.waiting == 1), ("w2", 10, lambda: queue.waiting == 2)):
            futures[name] = in_thread(ask, name, tokens)
            until(state, f"{name} in line")
            sent.append(name)
        refused = [ask(f"x{i}", 5) for i in range(3)]      # the line is full: refused at once
        for r in refused:
            assert r.status_code == 429 and r.headers["retry-after"]
            assert_valid("ErrorResponse", r.json())
            assert r.json()["error"]["type"] == "rate_limit_error"
        for name in sent:
            assert futures[name].result().status_code == 200
        assert [next(n for n in sent if f"Story {n}" in text) for text in starts] == sent
    finally:
        until(host.idle, "the small host idle")
        host.close()


def test_a_model_change_waits_for_the_running_sequences(make_server, tmp_path):
    import shutil

    from openai_ext.core.config import Settings
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.hosts.manager import StandaloneModels

    shutil.copy(default_gguf(), tmp_path / "Second.gguf")
    make_host = lambda path: LlamaCppHost(path, n_ctx=1024, parallel=2)  # noqa: E731
    host = make_host(default_gguf())
    settings = Settings(port=0, models_dir=str(tmp_path), parallel=2)
    server = make_server(host, StandaloneModels(settings, make_host, extra={host.path.name: host.path}),
                         models_dir=str(tmp_path), parallel=2)
    log = Log()
    body = {"max_tokens": 80, "temperature": 0, "ban_eos_token": True, "stream_options": {"include_usage": True}}
    streams = [in_thread(stream, server, who, log, {**body, "messages": [{"role": "user", "content": f"{LONG} {who}"}]})
               for who in ("a", "b")]
    until(lambda: ("a", "token") in log.first and ("b", "token") in log.first, "both streaming")
    r = httpx.post(f"{server.url}/internal/model/load", json={"model_name": "Second"}, timeout=300)
    log.add("load", "done")
    assert r.status_code == 200 and r.json() == "OK"
    # both ran to their end on the old model before it was closed
    assert [f.result()[-1]["usage"]["completion_tokens"] for f in streams] == [80, 80]
    assert log.index("a", "done") < log.index("load", "done") and log.index("b", "done") < log.index("load", "done")
    text = server.app.state.api.text
    assert text.host.model_id == "Second" and text.queue.capacity == 2
    r = httpx.post(f"{server.url}/chat/completions", timeout=120, json={
        "model": "x", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200 and r.json()["model"] == "Second"
    text.host.close()
