"""What real clients do to a server: cut streams, read slowly, send garbage, crowd in; and a host
that fails. The server must answer with OpenAI errors, free its lock, and keep serving. Cut streams
and the hostile probes run on the real model (how soon a generation stops, the real tokenizer and
grammar under attack); the rest on the scripted host."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import random
import socket
import sys
import threading
import time

import httpx
import pytest
from support.pieces import hook_pieces
from support.servers import idle, wait_until
from support.spec import assert_valid, parse_sse

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Write a very long story about a dragon."}]


class Produced(list):
    """When the host produced each piece; ``running`` counts the generations that have not left
    the host yet: when it is 0, no piece can follow until a new request comes."""
    running = 0


def counting(host, monkeypatch) -> Produced:
    times = Produced()

    def start(_prompt):
        times.running += 1

    def end():
        times.running -= 1
    hook_pieces(host, monkeypatch, start=start, piece=lambda i, p: times.append(time.monotonic()), end=end)
    return times


@pytest.fixture
def produced(llama_host, monkeypatch):
    """When the real host produced each piece."""
    return counting(llama_host, monkeypatch)


def producer_waits_for_room() -> bool:
    """Whether a thread that runs a host's generator is blocked handing a piece on to the event
    loop (text/generation.py's bounded channel is full): only a reader of the stream makes room."""
    for frame in sys._current_frames().values():
        names = []
        while frame is not None:
            names.append((frame.f_code.co_name, frame.f_code.co_filename.replace("\\", "/")))
            frame = frame.f_back
        if names and names[0][0] == "wait" and any(n == "put" and "janus" in f for n, f in names) and \
                any(n == "work" and f.endswith("text/generation.py") for n, f in names):
            return True
    return False


def test_fifty_streams_cut_at_random_points(live, llama_host, produced):
    rng = random.Random(50)
    threads_before = set(threading.enumerate())
    late = []
    for _ in range(50):
        body = {"model": "x", "messages": STORY, "max_tokens": 400, "stream": True, "temperature": 0.7}
        with httpx.stream("POST", f"{live.url}/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for _ in range(rng.randint(0, 40)):
                next(lines)
        cut = time.monotonic()
        assert idle(live, llama_host), "a cut stream left its generation running or the lock held"
        late.append(sum(1 for t in produced if t > cut))
    # each generation stopped within a token or two of its client leaving
    assert max(late) <= 2, late
    assert len(produced) < 50 * 400 / 2, "the cut streams were generated to the end"
    # No thread left behind: none still hands pieces to a stream that is gone, and no thread was
    # added per stream. AnyIO's pooled workers aside: how many a loop starts follows the machine's
    # load (each loop's pool is bounded, and an idle worker ends by itself).
    assert not producer_waits_for_room(), "a cut stream's generation thread still waits to hand on a piece"
    added = [t.name for t in threading.enumerate() if t not in threads_before and t.name != "AnyIO worker thread"]
    assert len(added) <= 4, f"threads leaked: {added}"
    r = httpx.post(f"{live.url}/chat/completions", json={"messages": STORY, "max_tokens": 5}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("method", ["chat_prompt", "tokenize"])
@pytest.mark.parametrize("stream", [False, True])
def test_host_failure_before_generation_is_a_500_error_object(scripted, scripted_host, monkeypatch, method, stream):
    """The host failing while the prompt is rendered or tokenized, before anything is generated."""
    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure inside the host")
    monkeypatch.setattr(scripted_host, method, broken)
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60,
                   json={"messages": STORY, "max_tokens": 5, "stream": stream})
    assert r.status_code == 500 and r.headers["content-type"].startswith("application/json")
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["type"] == "server_error" and "simulated" not in r.json()["error"]["message"]
    assert idle(scripted, scripted_host), "the failed request kept its place in the queue"
    monkeypatch.undo()
    r = httpx.post(f"{scripted.url}/chat/completions", json={"messages": STORY, "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("after", [0, 3])
def test_host_failure_without_streaming_is_a_500_error_object(scripted, scripted_host, failing_scripted, after):
    failing_scripted["after"] = after
    r = httpx.post(f"{scripted.url}/chat/completions", json={"messages": STORY, "max_tokens": 20}, timeout=60)
    assert r.status_code == 500
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["type"] == "server_error" and "simulated" not in r.json()["error"]["message"]
    assert idle(scripted, scripted_host)


@pytest.mark.parametrize("after", [0, 3])
def test_host_failure_mid_stream_is_an_error_event_then_done(scripted, scripted_host, failing_scripted, after):
    failing_scripted["after"] = after
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60,
                   json={"messages": STORY, "max_tokens": 20, "stream": True})
    events, done = parse_sse(r.text)
    assert done and "error" in events[-1]
    assert_valid("ErrorResponse", events[-1])
    assert idle(scripted, scripted_host)


def test_an_unexpected_failure_is_a_500_error_object_browsers_can_read(scripted, monkeypatch):
    def broken():
        raise KeyError("secret internals")
    monkeypatch.setattr(scripted.app.state.api.catalog, "cards", broken)
    r = httpx.get(f"{scripted.url}/models", headers={"Origin": "https://app.example"})
    assert r.status_code == 500
    assert_valid("ErrorResponse", r.json())
    assert "KeyError" in r.json()["error"]["message"] and "secret" not in r.json()["error"]["message"]
    assert r.headers["access-control-allow-origin"] == "*"
    monkeypatch.undo()
    assert httpx.get(f"{scripted.url}/models").status_code == 200


def test_server_keeps_serving_after_host_failures(scripted, scripted_host, failing_scripted):
    failing_scripted["after"] = 1
    httpx.post(f"{scripted.url}/chat/completions", json={"messages": STORY, "max_tokens": 5}, timeout=60)
    failing_scripted["after"] = 10 ** 9
    r = httpx.post(f"{scripted.url}/chat/completions", json={"messages": STORY, "max_tokens": 5}, timeout=60)
    assert r.status_code == 200


def test_a_slow_reader_pauses_the_generation_instead_of_buffering_it(scripted, script, monkeypatch):
    produced = counting(script, monkeypatch)
    script.script(" ".join(["word"] * 2000))   # written as fast as it is taken
    max_tokens = 1800
    body = json.dumps({"messages": STORY, "max_tokens": max_tokens, "stream": True, "temperature": 0,
                       "ban_eos_token": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a client that reads nothing
    sock.connect(("127.0.0.1", scripted.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    # the generation is held back by the unread stream: its thread waits for room to hand a piece on
    wait_until(producer_waits_for_room, "the generating thread waits for the reader")
    paused_at = len(produced)
    assert paused_at < max_tokens, "the whole answer was generated into buffers"
    # reading again resumes it
    sock.settimeout(30)
    data = b""
    # (on a loaded machine the kernel's buffers may grow and let it run on before the first read: read at least
    # until the head and a chunk are in)
    while len(produced) < paused_at + 50 or b"data: {" not in data:
        piece = sock.recv(65536)
        assert piece, "the server closed the stream"
        data += piece
    assert data.startswith(b"HTTP/1.1 200") and b"data: {" in data
    sock.close()   # and leaving stops it
    assert idle(scripted, script) and produced.running == 0
    assert len(produced) < max_tokens


def stalled_stream(port: int, body: dict) -> socket.socket:
    """A client that sends a streaming request, then reads nothing while keeping its socket open."""
    data = json.dumps(body).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def test_a_client_that_stops_reading_is_dropped_and_frees_the_queue(llama_host, make_server, produced):
    from openai_ext.core.config import Settings

    assert Settings().stream_send_timeout == 60
    server = make_server(llama_host, stream_send_timeout=2)
    errors: list[logging.LogRecord] = []   # what uvicorn logs as an error: nothing, the drop is on purpose
    catcher = logging.Handler(logging.ERROR)
    catcher.emit = errors.append
    logging.getLogger("uvicorn.error").addHandler(catcher)
    max_tokens = 1800
    sock = stalled_stream(server.port, {"messages": STORY, "max_tokens": max_tokens, "stream": True,
                                        "temperature": 0, "ban_eos_token": True})
    try:
        # a second client waits in the queue behind the stalled one, and is served once the
        # stalled stream is dropped, before that stream could have been generated to its end
        r = httpx.post(f"{server.url}/chat/completions", json={"messages": STORY, "max_tokens": 3}, timeout=90)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert len(produced) < max_tokens, "the stalled stream was generated to the end"
        # the stalled stream's generation stopped for good, though its socket is still open: it
        # has left the host, and nothing else runs there
        assert idle(server, llama_host) and produced.running == 0
        # and the server dropped the connection: what is left to read ends
        sock.settimeout(10)
        while sock.recv(65536):
            pass
        assert not errors, [r.getMessage() for r in errors]
    finally:
        sock.close()
        logging.getLogger("uvicorn.error").removeHandler(catcher)


def test_a_stalled_stream_is_dropped_at_its_send_timeout_on_the_scripted_host(scripted_host, make_server, caplog):
    """The same drop, on the scripted host (fast tier): the stalled send is given up after
    stream_send_timeout, the generation stops, the next request is served, and the only thing
    logged is our warning (uvicorn's error for an unfinished response is filtered)."""
    server = make_server(scripted_host, stream_send_timeout=1)
    scripted_host.script(" ".join(["word"] * 20000))
    sock = stalled_stream(server.port, {"messages": STORY, "max_tokens": 20000, "stream": True})
    try:
        with caplog.at_level(logging.WARNING):
            wait_until(lambda: any("read nothing of its stream" in r.getMessage() for r in caplog.records),
                       "the stalled stream is dropped", tries=1200)
            assert idle(server, scripted_host)
            scripted_host.script("Served.")
            r = httpx.post(f"{server.url}/chat/completions", json={"messages": STORY, "max_tokens": 5}, timeout=30)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Served."
            sock.settimeout(10)
            while sock.recv(65536):   # the server ended the connection
                pass
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    finally:
        sock.close()


@pytest.mark.parametrize("body, content_type", [
    (b'{"messages": [', "application/json"),                                  # malformed JSON
    (b'{"messages": "hi"}', "application/json"),                              # wrong type
    (b'{"messages": [{"role": "user", "content": 5}]}', "application/json"),  # wrong nested type
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e308}', "application/json"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 100000000000000000000}', "application/json"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "lots"}', "application/json"),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe bad utf-8"}]}', "application/json"),
    (b"\xff\xfe\xfa", "application/json"),
    (b"", "application/json"),
    (b"[1, 2, 3]", "application/json"),
    (b"messages=hi", "application/x-www-form-urlencoded"),
    (b"[" * 100_000 + b"]" * 100_000, "application/json"),                   # deep nesting
    (b'{"messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}', "application/json"),
])
def test_garbage_gets_a_4xx_openai_error(scripted, body, content_type):
    r = httpx.post(f"{scripted.url}/chat/completions", content=body, headers={"Content-Type": content_type},
                   timeout=30)
    assert 400 <= r.status_code < 500, r.text
    assert_valid("ErrorResponse", r.json())


def test_unknown_fields_get_a_400_naming_them(scripted, scripted_host):
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60, json={
        "messages": STORY, "max_tokens": 2, "frobnicate": True, "mode": "instruct"})
    assert r.status_code == 400 and "frobnicate" in r.json()["error"]["message"]
    assert_valid("ErrorResponse", r.json())
    assert idle(scripted, scripted_host)
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60, json={   # the web UI's own fields pass
        "messages": STORY, "max_tokens": 2, "mode": "instruct"})
    assert r.status_code == 200


def test_huge_max_tokens_is_clamped_not_an_error(scripted, scripted_host):
    r = httpx.post(f"{scripted.url}/completions", timeout=60,
                   json={"prompt": "hi", "max_tokens": 10 ** 30, "stop": ["\n"], "temperature": 0})
    assert r.status_code == 200


def noting_the_line(server, fn):
    """Runs fn, and notes how many requests were still being prepared or generated when its
    answer came back: an event the server exposes, not a timer."""
    def run(*args):
        result = fn(*args)
        queue = server.app.state.api.text.queue
        return result, queue.running + queue.waiting
    return run


PREPARE_SECONDS = 0.2


def test_overload_is_served_or_refused_never_hung(scripted_host, make_server, monkeypatch):
    server = make_server(scripted_host, max_queue=8)
    real_chat_prompt = scripted_host.chat_prompt
    prepared = []

    def slow_chat_prompt(*args, **kwargs):   # a long prompt takes this long to render and tokenize
        prepared.append(1)
        time.sleep(PREPARE_SECONDS)
        return real_chat_prompt(*args, **kwargs)
    monkeypatch.setattr(scripted_host, "chat_prompt", slow_chat_prompt)

    def ask(i):
        try:
            r = httpx.post(f"{server.url}/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": f"Say a number: {i}"}], "max_tokens": 12})
        except httpx.TransportError as e:
            return ("transport", str(e))
        return (r.status_code, r.headers.get("retry-after"), r.json())

    with concurrent.futures.ThreadPoolExecutor(max_workers=100) as pool:
        results = list(pool.map(noting_the_line(server, ask), range(100)))
    codes = [r[0] for r, _ in results]
    assert set(codes) <= {200, 429}, codes
    assert 9 <= codes.count(200) < 100
    for (status, retry_after, body), _ in results:
        assert_valid("ErrorResponse" if status == 429 else "CreateChatCompletionResponse", body)
        if status == 429:
            assert retry_after and body["error"]["type"] == "rate_limit_error"
    # "at once": a refused request is refused before its prompt is prepared, so it never waits
    # while the requests ahead of it are prepared, one at a time, PREPARE_SECONDS each
    assert len(prepared) == codes.count(200)
    # and a refusal comes while the line it could not join is still full of work
    busy_at_refusal = [busy for (status, *_), busy in results if status == 429]
    assert sum(busy > 0 for busy in busy_at_refusal) >= len(busy_at_refusal) * 0.9, busy_at_refusal
    assert idle(server, scripted_host)
    r = httpx.post(f"{server.url}/chat/completions", json={"messages": STORY, "max_tokens": 3}, timeout=60)
    assert r.status_code == 200


def _deep(levels: int, key: str) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema} if key == "items" else {"anyOf": [schema, {"type": "null"}]}
    return schema


HOSTILE = [
    # (path, raw body or JSON, what it probes)
    ("/chat/completions", b'{"model":"x","messages":[{"role":"user","content":"\\ud800"}]}', "lone surrogate"),
    ("/chat/completions", b'{"model":"x","messages":[{"role":"user","content":"\xed\xa0\x80"}]}', "raw surrogate"),
    ("/embeddings", b'{"model":"text-embedding-3-small","input":["ok","bad \\udfff"]}', "bad batch member"),
    ("/internal/token-count", {"text": "<|im_end|>" * 26_000}, "special-token flood"),
    ("/chat/completions", {"model": "x", "max_tokens": 1,
                           "messages": [{"role": "user", "content": "hi"}] * 100_000}, "huge message list"),
    ("/chat/completions", {"model": "x", "messages": STORY, "max_tokens": 5, "response_format": {
        "type": "json_schema", "json_schema": {"name": "d", "schema": _deep(150, "items")}}}, "deep items schema"),
    ("/chat/completions", {"model": "x", "messages": STORY, "max_tokens": 5, "tools": [{"type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": _deep(100, "anyOf")}}}}],
        "tool_choice": "required"}, "deep anyOf tool"),
]


@pytest.mark.engines   # the embeddings probe loads the embedding model
def test_hostile_probes_get_4xx_and_never_hurt_the_requests_beside_them(live, llama_host):
    """The probes found by hand, sent together with ordinary requests: each gets a client error
    (never a 5xx, never a hang), and every ordinary request beside them is served."""

    def send(item):
        path, body, what = item
        if isinstance(body, bytes):
            r = httpx.post(f"{live.url}{path}", content=body, headers={"content-type": "application/json"},
                           timeout=120)
        else:
            r = httpx.post(f"{live.url}{path}", json=body, timeout=120)
        return what, r

    def ordinary(i):
        return httpx.post(f"{live.url}/chat/completions", timeout=120, json={
            "model": "x", "messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": 4})

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        probes = [pool.submit(send, item) for item in HOSTILE]
        good = [pool.submit(ordinary, i) for i in range(6)]
        answered = [p.result() for p in probes]
        served = [g.result() for g in good]
    for what, r in answered:
        if what == "special-token flood":
            assert r.status_code == 200 and r.json()["length"] == 26_000, what
        else:
            assert 400 <= r.status_code < 500, (what, r.status_code, r.text[:300])
            assert_valid("ErrorResponse", r.json())
    assert [r.status_code for r in served] == [200] * 6
    assert idle(live, llama_host)
