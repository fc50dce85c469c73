"""The upstream host against an upstream that misbehaves (support/fake_upstream.py): one that
hangs before or in the middle of its answer, sends garbage, cuts its stream, answers with a page
or a plain JSON body, fails, goes down and comes back. The front is driven as clients drive it
(the official SDKs, httpx, raw sockets for clients that leave); no model is loaded. Every wait is
for an event (support.servers.wait_until), never for a length of time."""

from __future__ import annotations

import json
import socket
import threading

import anthropic
import httpx
import openai
import pytest
import requests
from support.fake_upstream import FakeUpstream
from support.servers import openai_client, wait_until
from support.spec import assert_valid, error_of, parse_sse

from openai_ext.hosts.upstream import UpstreamHost
from openai_ext.hosts.upstream import calls as upstream_calls

ASK = {"model": "x", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]}


@pytest.fixture
def fake():
    """A fake upstream of the test's own."""
    upstream = FakeUpstream()
    yield upstream
    if not upstream.stopped:
        upstream.stop()


@pytest.fixture
def gateway(fake, make_server):
    """Builds a front on the fake upstream: (server, host). Keywords go to UpstreamHost."""
    hosts = []

    def build(**kw):
        host = UpstreamHost(fake.url, **kw)
        hosts.append(host)
        return make_server(host), host

    yield build
    for host in hosts:
        host.close()


def health(front) -> httpx.Response:
    return httpx.get(front.url.removesuffix("/v1") + "/health", timeout=30)


def post(front, *, stream: bool = False, **kw) -> httpx.Response:
    return httpx.post(f"{front.url}/chat/completions", json={**ASK, "stream": stream, **kw}, timeout=60)


def streamed(front, **kw) -> tuple[list[dict], dict | None]:
    """A streamed chat's chunks (each valid) and its closing error object, if it has one; the
    stream ends with [DONE] either way."""
    r = post(front, stream=True, **kw)
    assert r.status_code == 200, r.text
    events, done = parse_sse(r.text)
    assert done, "the stream did not end with data: [DONE]"
    error = None
    if events and "error" in events[-1]:
        assert_valid("ErrorResponse", events[-1])
        error = events.pop()["error"]
    for chunk in events:
        assert_valid("CreateChatCompletionStreamResponse", chunk)
    return events, error


def text_of(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def finish_reasons(chunks: list[dict]) -> list[str]:
    return [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]


def leaving_client(front) -> socket.socket:
    """A client that sends a chat request and reads nothing: closing its socket is leaving."""
    body = json.dumps(ASK).encode()
    port = int(front.url.split(":")[-1].split("/")[0])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (port, len(body), body))
    return sock


def test_the_fake_is_served_as_vllm(gateway):
    front, host = gateway()
    assert host.describe()["engine"] == "vllm"
    r = openai_client(front).chat.completions.create(**ASK)
    assert r.choices[0].message.content == "Hello there" and r.choices[0].finish_reason == "stop"
    assert host.readiness()["ready"] is True


def test_clients_that_leave_free_every_slot_while_the_upstream_hangs(fake, gateway):
    """Ten clients, eight slots, an upstream that accepts and never answers: the clients leave, the
    front cuts its eight calls waiting for headers (the default first-byte timeout is a minute
    away), the upstream sees its connections closed, nothing runs; and once the upstream answers
    again, the next request is served."""
    front, host = gateway(parallel=8)
    queue = front.app.state.api.text.queue
    fake.mode = "hang"
    clients = [leaving_client(front) for _ in range(10)]
    try:
        wait_until(lambda: fake.hanging == 8 and queue.waiting == 2,
                   "eight generations held by the upstream and two in line", tries=600)
    finally:
        for sock in clients:
            sock.close()
    # every connection the upstream held is closed; on a loaded machine one of the two clients in line may
    # get a freed slot (and call the upstream) before its own leaving is seen: it is closed as well
    wait_until(lambda: fake.closed >= 8 and fake.hanging == 0,
               "the upstream saw every connection it held closed", tries=600)
    wait_until(lambda: (lambda b: b["running"] == 0 and b["queued"] == 0)(health(front).json()),
               "nothing running or waiting at the front", tries=600)
    fake.mode = "ok"
    r = openai_client(front).chat.completions.create(**ASK)
    assert r.choices[0].message.content == "Hello there"
    assert host.readiness()["failures"] == 0   # clients leaving are no fault of the upstream


def test_a_client_that_leaves_while_the_upstream_is_silent_mid_stream(fake, gateway):
    front, _ = gateway()
    fake.mode = "hang_mid"
    with httpx.stream("POST", f"{front.url}/chat/completions", json={**ASK, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:") and '"Hello"' in line)
    wait_until(lambda: fake.closed == 1, "the upstream saw its connection closed", tries=600)
    wait_until(lambda: health(front).json()["running"] == 0, "the slot was given back", tries=600)


def test_the_first_byte_timeout(fake, gateway):
    front, host = gateway(first_byte_timeout=0.5)
    fake.mode = "hang"
    err = error_of(post(front), 504)
    assert err["code"] == "upstream_timeout" and err["type"] == "server_error"
    assert host.shown in err["message"] and "upstream_first_byte_timeout" in err["message"]
    chunks, error = streamed(front)
    assert text_of(chunks) == "" and error["code"] == "upstream_timeout"
    wait_until(lambda: fake.closed == 2, "the upstream saw both connections closed", tries=600)


def test_the_idle_timeout_between_chunks(fake, gateway):
    front, host = gateway(idle_timeout=0.5)
    fake.mode = "hang_mid"
    chunks, error = streamed(front)
    assert text_of(chunks) == "Hello" and finish_reasons(chunks) == []
    assert error["code"] == "upstream_timeout" and "upstream_idle_timeout" in error["message"]
    assert host.shown in error["message"]
    err = error_of(post(front), 504)
    assert err["code"] == "upstream_timeout"


@pytest.mark.parametrize(("mode", "says"), [
    ("garbage", "not JSON"),
    ("shape", "not a list"),
    ("error_event", "CUDA out of memory"),
    ("abort", "gave up on the answer"),
    ("html", "text/html"),
    ("json", "application/json"),
    ("500", "the engine crashed"),
])
def test_a_broken_answer_is_the_upstreams_fault(fake, gateway, mode, says):
    """A 502 that names the upstream and what was wrong, never a 500 blaming the model; streamed,
    the error event, never a finished answer."""
    front, host = gateway()
    fake.mode = mode
    with pytest.raises(openai.InternalServerError) as e:
        openai_client(front).chat.completions.create(**ASK)
    assert e.value.status_code == 502
    err = e.value.body
    assert err["code"] == "upstream_error", err
    assert host.shown in err["message"] and says in err["message"] and "model failed" not in err["message"]
    chunks, error = streamed(front)
    assert error is not None and error["code"] == "upstream_error" and says in error["message"]
    assert finish_reasons(chunks) == []


def test_a_cut_stream_is_never_a_finished_answer(fake, gateway):
    front, host = gateway()
    fake.mode = "cut"
    chunks, error = streamed(front)
    assert text_of(chunks) == "Hello there"
    assert finish_reasons(chunks) == [], "a cut answer must not look finished"
    assert error["code"] == "upstream_error" and "in the middle of the answer" in error["message"]
    err = error_of(post(front), 502)
    assert err["code"] == "upstream_error" and host.shown in err["message"]


def test_faults_are_told_in_the_callers_dialect(fake, gateway):
    front, host = gateway()
    fake.mode = "garbage"
    claude = anthropic.Anthropic(base_url=front.url.removesuffix("/v1"), api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(model="x", max_tokens=16, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.status_code == 502 and e.value.body["type"] == "error"
    assert host.shown in e.value.body["error"]["message"]


def test_the_breaker_opens_after_faults_in_a_row_and_closes_by_itself(fake, gateway):
    front, host = gateway()
    fake.mode, fake.models_ok = "500", False
    for _ in range(3):
        assert error_of(post(front), 502)["code"] == "upstream_error"
    reached = sum(n for path, n in fake.hits.items() if path != "/v1/models")
    # open: refused at once, before a place in line, without reaching the upstream
    r = post(front)
    assert error_of(r, 503)["code"] == "upstream_unavailable" and r.headers["Retry-After"]
    with pytest.raises(openai.InternalServerError) as e:
        openai_client(front).chat.completions.create(**ASK)
    assert e.value.status_code == 503 and host.shown in e.value.body["message"]
    assert sum(n for path, n in fake.hits.items() if path != "/v1/models") == reached
    assert health(front).status_code == 503
    ready = host.readiness()
    assert ready["ready"] is False and ready["breaker"] == "open" and host.shown in ready["error"]
    # the upstream is back: the breaker's own checks find it, no request has to
    fake.mode, fake.models_ok = "ok", True
    wait_until(lambda: post(front).status_code == 200, "a request is served again", tries=600)
    assert health(front).status_code == 200 and host.readiness()["breaker"] == "closed"


def test_the_upstreams_client_errors_do_not_open_the_breaker(fake, gateway):
    front, host = gateway()
    fake.mode = "400"
    for _ in range(4):
        assert "the prompt is too long" in error_of(post(front), 400)["message"]
    fake.mode = "ok"
    assert post(front).status_code == 200 and host.readiness()["failures"] == 0


def test_an_idle_front_notices_its_upstream_down_and_back(fake, gateway):
    """No request fails: the health checks alone find the upstream gone, then back."""
    front, host = gateway()
    assert host.readiness()["ready"] is True
    fake.stop()
    wait_until(lambda: not host.readiness()["ready"], "readiness says the upstream is down", tries=600)
    assert host.shown in host.readiness()["error"]
    # asked often enough, the checks open the breaker, and /health says so too
    wait_until(lambda: host.readiness() and health(front).status_code == 503, "/health says unavailable",
               tries=600)
    fake.start()
    wait_until(lambda: host.readiness()["ready"], "readiness says the upstream is back", tries=600)
    assert health(front).status_code == 200
    assert openai_client(front).chat.completions.create(**ASK).choices[0].message.content == "Hello there"


def test_a_pooled_connection_is_never_cut_after_its_call_ended(fake):
    """A call's connection goes back to the pool once its answer is read; cutting that call then
    must not cut the connection, which another call may be using."""
    calls, session = upstream_calls.Calls(), upstream_calls.session(2)
    try:
        with calls.track(None, 60) as first:
            with first.sending():
                assert session.get(fake.url + "/models", timeout=30).status_code == 200
            with calls.track(None, 60) as second:
                with second.sending():
                    assert session.get(fake.url + "/models", timeout=30).status_code == 200
                first.abort("stopped")
                second.abort("stopped")   # read whole: its connection is back in the pool too
        assert session.get(fake.url + "/models", timeout=30).status_code == 200
        assert fake.connections == 1   # one connection served all three, never found cut
    finally:
        calls.close()
        session.close()


def test_a_call_is_cut_while_it_waits_for_headers(fake):
    fake.mode = "hang"
    calls, session = upstream_calls.Calls(), upstream_calls.session(2)
    stop = threading.Event()

    def leave_once_held() -> None:
        wait_until(lambda: fake.hanging == 1, "the upstream holds the request", tries=600)
        stop.set()

    try:
        with calls.track(stop, 60) as call:
            threading.Thread(target=leave_once_held).start()
            with pytest.raises(requests.ConnectionError), call.sending():
                session.post(fake.url + "/completions", json={}, timeout=(5, 600))
        assert call.reason == "stopped"
        wait_until(lambda: fake.closed == 1, "the upstream saw the connection closed")
    finally:
        calls.close()
        session.close()


def test_a_stream_not_sent_in_chunks_is_passed_on_as_it_arrives(fake, gateway):
    """An upstream whose stream is not chunked (it ends where its connection closes): its first
    chunk reaches the client while the upstream still holds the rest."""
    front, _ = gateway()
    fake.mode = "unchunked"
    with httpx.stream("POST", f"{front.url}/chat/completions", json={**ASK, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:") and '"content":"Hello"' in line)
        assert json.loads(first[5:])["choices"][0]["delta"]["content"] == "Hello"
        assert not fake.rest_sent   # it came while the upstream still held the rest
        fake.release.set()   # only now does the upstream send the rest
        rest = [line[5:].strip() for line in lines if line.startswith("data:")]
    assert rest[-1] == "[DONE]"
    chunks = [json.loads(x) for x in rest[:-1]]
    assert "there" in text_of(chunks) and finish_reasons(chunks) == ["stop"]
