"""The upstream host: this server in front of another OpenAI-compatible engine. The upstream here
is another instance of this server on the real model (in this process, or in a process of its
own where it is killed and started again); every family is driven through the front with the
official SDKs and compared with the upstream answering directly."""

from __future__ import annotations

import json
import signal
import time

import anthropic
import httpx
import openai
import pytest
from support import processes
from support.servers import openai_client, wait_until
from support.spec import assert_valid, assert_valid_stream, error_of

from openai_ext.hosts.upstream import UpstreamHost, redact

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}


@pytest.fixture(scope="module")
def front(live, make_server, tmp_path_factory):
    host = UpstreamHost(live.url)
    yield make_server(host, data_dir=str(tmp_path_factory.mktemp("front-data")))
    host.close()


def chat(client, **kw):
    raw = client.chat.completions.with_raw_response.create(**{"model": "x", "temperature": 0, **kw})
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    return raw.parse()


def test_the_front_serves_the_upstream_model(front, live):
    ids = [m.id for m in openai_client(front).models.list().data]
    assert ids[0] == openai_client(live).models.list().data[0].id
    info = httpx.get(f"{front.url}/internal/model/info").json()
    assert info["loader"] == "upstream" and info["engine"] == "openai_ext" and info["token_counts"] == "exact"
    assert info["n_ctx"] == 2048


def test_chat_and_completions_are_the_upstreams_own_answers(front, live):
    direct, through = openai_client(live), openai_client(front)
    ask = {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12, "logprobs": True,
           "top_logprobs": 2}
    a, b = chat(direct, **ask), chat(through, **ask)
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.usage == a.usage
    assert [(t.token, round(t.logprob, 4)) for t in b.choices[0].logprobs.content] == \
        [(t.token, round(t.logprob, 4)) for t in a.choices[0].logprobs.content]
    c = through.completions.create(model="x", prompt="The capital of France is", max_tokens=5, temperature=0)
    d = direct.completions.create(model="x", prompt="The capital of France is", max_tokens=5, temperature=0)
    assert (c.choices[0].text, c.usage) == (d.choices[0].text, d.usage)
    r = httpx.post(f"{front.url}/chat/completions", json={
        "model": "x", "stream": True, "temperature": 0, "max_tokens": 8, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Say hi."}]}, timeout=120)
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_tools_and_json_are_enforced_by_the_upstreams_grammar(front):
    through = openai_client(front)
    r = chat(through, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
             tool_choice="required", max_tokens=60)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"],
              "additionalProperties": False}
    r = chat(through, messages=[{"role": "user", "content": "How old are you?"}], max_tokens=30,
             response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}})
    assert isinstance(json.loads(r.choices[0].message.content)["age"], int)


def test_responses_and_messages_run_on_top(front):
    through = openai_client(front)
    first = through.responses.create(model="x", input="My name is Ada.", max_output_tokens=16, temperature=0)
    second = through.responses.create(model="x", previous_response_id=first.id, input="What is my name?",
                                      max_output_tokens=16, temperature=0)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    claude = anthropic.Anthropic(base_url=front.url.removesuffix("/v1"), api_key="x", max_retries=0)
    msg = claude.messages.create(model="x", max_tokens=16, messages=[{"role": "user", "content": "Say hi."}])
    assert msg.content[0].type == "text" and msg.usage.output_tokens > 0


def test_a_client_that_leaves_cancels_the_upstream_generation(front, live):
    """The front closes its upstream connection when its client leaves; the upstream sees its own
    client gone and stops (its /health shows nothing running), long before max_tokens."""
    health = live.url.removesuffix("/v1") + "/health"
    with httpx.stream("POST", f"{front.url}/chat/completions", timeout=120, json={
            "model": "x", "stream": True, "max_tokens": 1500, "ban_eos_token": True,
            "messages": [{"role": "user", "content": "Write a very long story."}]}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:") and '"content"' in line)
        assert httpx.get(health).json()["running"] == 1
    # the client is gone: the upstream reports itself idle (polled, not timed)
    wait_until(lambda: httpx.get(health).json()["running"] == 0, "the upstream stopped generating", tries=600)


def test_the_upstreams_key(live, make_server, llama_host):
    guarded = make_server(llama_host, api_key="upstream-secret")
    wrong = make_server(UpstreamHost(guarded.url, api_key="nope"))
    err = error_of(httpx.post(f"{wrong.url}/chat/completions", timeout=60, json={
        "model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}), 502)
    assert err["code"] == "upstream_auth" and "upstream_api_key" in err["message"] and "nope" not in err["message"]
    right = make_server(UpstreamHost(guarded.url, api_key="upstream-secret"))
    assert chat(openai_client(right), messages=[{"role": "user", "content": "Hi"}], max_tokens=4).choices


def test_credentials_never_show():
    assert redact("https://user:pw@gpu.example:8000/v1") == "https://gpu.example:8000/v1"


@pytest.mark.slow
def test_an_upstream_that_dies_and_comes_back(tmp_path, make_server):
    upstream = processes.serve(tmp_path, "--parallel", "2", "--n-ctx", "2048")
    host = UpstreamHost(upstream.url, connect_timeout=2)
    front = make_server(host)
    client = openai_client(front)
    ask = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    assert chat(client, **ask).choices[0].message.content is not None
    try:
        # killed in the middle of a stream: the stream ends with an error event and [DONE]
        with httpx.stream("POST", f"{front.url}/chat/completions", timeout=120, json={
                "model": "x", "stream": True, "max_tokens": 400, "ban_eos_token": True,
                "messages": [{"role": "user", "content": "Write a long story."}]}) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            assert json.loads(first[5:])["choices"]
            processes.stop(upstream, signal.SIGKILL)
            rest = [line[5:].strip() for line in lines if line.startswith("data:")]
        assert rest[-1] == "[DONE]"
        error = json.loads(rest[-2])["error"]
        assert error["code"] in ("upstream_error", "upstream_unavailable"), error
        # at rest: a 503 in the client's dialect, at once (connection refused), and /health stays up
        with pytest.raises(openai.InternalServerError) as e:
            chat(client.with_options(max_retries=0), **ask)
        assert e.value.status_code == 503 and e.value.body["code"] == "upstream_unavailable"
        claude = anthropic.Anthropic(base_url=front.url.removesuffix("/v1"), api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as ea:
            claude.messages.create(model="x", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        assert ea.value.status_code == 503 and ea.value.body["type"] == "error"
        # three faults in a row: the breaker is open, and the next request is refused at once
        assert host.readiness()["breaker"] == "open"
        # back on the same port: the breaker's own checks find it, and it is served again,
        # without restarting the front
        upstream = processes.serve(tmp_path, "--parallel", "2", "--n-ctx", "2048", port=upstream.port)
        wait_until(lambda: host.readiness()["ready"], "the front finds the upstream back", tries=600)
        assert chat(client, **ask).choices[0].message.content is not None
    finally:
        processes.stop(upstream)
        host.close()


def test_an_upstream_that_is_down_when_the_front_starts(make_server):
    from support.servers import free_port

    host = UpstreamHost(f"http://127.0.0.1:{free_port()}/v1", connect_timeout=1)
    front = make_server(host)
    err = error_of(httpx.post(f"{front.url}/chat/completions", timeout=60, json={
        "model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}), 503)
    assert err["code"] == "upstream_unavailable" and "cannot be reached" in err["message"]
    assert httpx.get(front.url.removesuffix("/v1") + "/health").status_code == 503
    host.close()


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """llama-server on the same GGUF, when one is on the PATH (the web UI's llama.cpp loader uses
    it; CI has none)."""
    import shutil
    import subprocess

    from support.servers import free_port

    from openai_ext.hosts.files import default_gguf

    binary = shutil.which("llama-server")
    if binary is None:
        pytest.skip("llama-server is not on the PATH")
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "log"
    with open(log, "w") as out:
        proc = subprocess.Popen([binary, "-m", str(default_gguf()), "--port", str(port), "-c", "4096",
                                 "--parallel", "2", "--jinja", "-t", "1"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_llama_server_as_the_upstream(llama_server, make_server):
    host = UpstreamHost(llama_server)
    front = make_server(host)
    assert host.describe()["engine"] == "llama.cpp" and host.context_length() == 2048   # per slot
    client = openai_client(front)
    r = chat(client, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
             tool_choice="required", max_tokens=60)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    r = chat(client, messages=[{"role": "user", "content": "Count to five."}], max_tokens=8, logprobs=True,
             top_logprobs=2)
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens == 8
    assert "".join(t.token for t in r.choices[0].logprobs.content) == r.choices[0].message.content
    resp = client.responses.create(model="x", input="Say hi.", max_output_tokens=16, temperature=0)
    assert resp.output_text and resp.usage.output_tokens > 0
    host.close()


@pytest.fixture(scope="module")
def vllm(live, llama_host):
    """The vLLM double (tests/doubles/vllm) on a free port, generating through ``live``."""
    import sys
    import threading

    import uvicorn
    from support import DOUBLES
    from support.servers import free_port

    sys.path.insert(0, str(DOUBLES / "vllm"))
    from vllm_double import app

    double = app(llama_host, live.url)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(double, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield double, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=30)


def test_vllm_as_the_upstream(vllm, make_server):
    double, url = vllm
    host = UpstreamHost(url)
    front = make_server(host)
    assert host.describe()["engine"] == "vllm" and host.context_length() == 2048
    client = openai_client(front)
    assert client.models.list().data[0].id == "Qwen/Qwen2.5-0.5B-Instruct"
    r = chat(client, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
             tool_choice="required", max_tokens=60)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    sent = double.state.requests[-1]
    assert sent["structured_outputs"]["grammar"].startswith("root ::=") and isinstance(sent["prompt"], list)
    r = chat(client, messages=[{"role": "user", "content": "Count to five."}], max_tokens=8, logprobs=True,
             top_logprobs=2, extra_body={"top_k": 20})
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens == 8
    assert double.state.requests[-1]["top_k"] == 20
    claude = anthropic.Anthropic(base_url=front.url.removesuffix("/v1"), api_key="x", max_retries=0)
    msg = claude.messages.create(model="x", max_tokens=16, messages=[{"role": "user", "content": "Say hi."}])
    assert msg.usage.output_tokens > 0
    host.close()
