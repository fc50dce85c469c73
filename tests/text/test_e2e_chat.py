"""End to end: /v1/chat/completions driven by the official client, on the real SmolLM2 model where
the test is about what a model writes, and on the scripted host where it is about the API's shape."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.spec import assert_valid, assert_valid_stream

Q = [{"role": "user", "content": "Name three colours of the rainbow."}]


def raw_chat(client, **kw):
    raw = client.chat.completions.with_raw_response.create(model="gpt-3.5-turbo", **kw)
    body = raw.http_response.json()
    assert_valid("CreateChatCompletionResponse", body)
    return raw.parse(), body


def stream_text(live, **body):
    """POSTs a streaming chat request; returns the raw SSE text after validating every chunk."""
    r = httpx.post(f"{live.url}/chat/completions", json={"model": "x", "stream": True, **body}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return assert_valid_stream("CreateChatCompletionStreamResponse", r.text)


def test_chat_completion_is_real_and_conformant(client, llama_host):
    resp, body = raw_chat(client, messages=Q, temperature=0, max_tokens=24)
    choice = resp.choices[0]
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert resp.model == llama_host.model_id           # the loaded model, whatever name was asked for
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert body["choices"][0]["message"]["refusal"] is None and body["choices"][0]["logprobs"] is None
    assert resp.system_fingerprint.startswith("fp_")
    # exact usage, counted with the model's own tokenizer
    prompt = llama_host.chat_prompt(Q)
    assert resp.usage.prompt_tokens == len(llama_host.tokenize(prompt.text))
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_system_and_developer_messages_reach_the_prompt(llama_host):
    from openai_ext.text.chat import normalize_messages
    from openai_ext.text.protocol import ChatCompletionRequest

    req = ChatCompletionRequest(messages=[
        {"role": "system", "content": "SYSTEM-RULE"},
        {"role": "developer", "content": "DEV-RULE"},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
    ])
    text = llama_host.chat_prompt(normalize_messages(req)).text
    assert "SYSTEM-RULE" in text and "DEV-RULE" in text and "part one\npart two" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_length_finish_at_exactly_max_tokens(sclient):
    resp, _ = raw_chat(sclient, messages=[{"role": "user", "content": "Write a long story about a dragon."}],
                       temperature=0, max_tokens=7, logprobs=True)
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 7
    assert len(choice.logprobs.content) == 7
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content


def test_max_completion_tokens_wins_over_max_tokens(sclient):
    resp, _ = raw_chat(sclient, messages=Q, temperature=0, max_tokens=20, max_completion_tokens=3)
    assert resp.usage.completion_tokens == 3 and resp.choices[0].finish_reason == "length"


def test_natural_stop_gives_finish_reason_stop(sclient):
    resp, _ = raw_chat(sclient, messages=[{"role": "user", "content": "Say hi."}], temperature=0, max_tokens=200)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens < 200


def test_streaming_matches_non_streaming(scripted, sclient):
    full, _ = raw_chat(sclient, messages=Q, temperature=0, max_tokens=30)
    chunks = stream_text(scripted, messages=Q, temperature=0, max_tokens=30)
    first = chunks[0]["choices"][0]
    assert first["delta"]["role"] == "assistant" and first["delta"]["content"] == ""
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == full.choices[0].message.content
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == full.choices[0].finish_reason and all(f is None for f in finishes[:-1])


def test_sdk_stream_helper_accumulates(sclient):
    msgs = [{"role": "user", "content": "Say hi."}]
    with sclient.chat.completions.stream(model="local", messages=msgs, temperature=0, max_tokens=100) as s:
        deltas = [e.delta for e in s if e.type == "content.delta"]
        final = s.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == "".join(deltas) != ""


def _greedy_tokens(client, messages, n):
    resp, _ = raw_chat(client, messages=messages, temperature=0, max_tokens=n, logprobs=True)
    return [t.token for t in resp.choices[0].logprobs.content]


def test_stop_string_split_across_tokens_never_appears(scripted, sclient):
    msgs = [{"role": "user", "content": "Write a long story about a dragon."}]
    tokens = _greedy_tokens(sclient, msgs, 40)
    text = "".join(tokens)
    # a stop string that starts inside one token and ends inside a later one
    boundary = len(tokens[0]) + len(tokens[1]) + len(tokens[2])
    start = boundary - 2
    assert len(tokens[3]) >= 2, tokens
    stop = text[start:boundary + 2]
    expected = text[:text.find(stop)]

    resp, _ = raw_chat(sclient, messages=msgs, temperature=0, max_tokens=40, stop=[stop, "never-happens"])
    assert resp.choices[0].message.content == expected
    assert resp.choices[0].finish_reason == "stop"

    chunks = stream_text(scripted, messages=msgs, temperature=0, max_tokens=40, stop=stop)
    deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert "".join(deltas) == expected
    assert all(stop not in d for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_seed_reproduces_text(client):
    kw = dict(messages=[{"role": "user", "content": "Tell me a fun fact."}], temperature=1.0, max_tokens=25)
    a, _ = raw_chat(client, seed=1234, **kw)
    b, _ = raw_chat(client, seed=1234, **kw)
    c, _ = raw_chat(client, seed=98765, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert c.choices[0].message.content != a.choices[0].message.content


def test_n_choices_have_distinct_indices(client):
    resp, _ = raw_chat(client, messages=Q, temperature=1.0, max_tokens=10, n=2, seed=7)
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.choices[0].message.content != resp.choices[1].message.content
    assert resp.usage.completion_tokens == 20


def test_n_choices_stream_with_indices_and_usage(scripted):
    chunks = stream_text(scripted, messages=Q, temperature=1.0, max_tokens=6, n=2, seed=3,
                         stream_options={"include_usage": True})
    per_index = {}
    for c in chunks[:-1]:
        assert c["usage"] is None and len(c["choices"]) == 1
        ch = c["choices"][0]
        per_index.setdefault(ch["index"], []).append(ch)
    assert sorted(per_index) == [0, 1]
    for items in per_index.values():
        assert items[0]["delta"]["role"] == "assistant"
        assert items[-1]["finish_reason"] == "length"
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 12
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 12


def test_logprobs_shapes(client):
    resp, body = raw_chat(client, messages=Q, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        # greedy: the chosen token is the most likely one
        assert entry.token == entry.top_logprobs[0].token
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_logit_bias_bans_a_token(client, llama_host):
    base, _ = raw_chat(client, messages=Q, temperature=0, max_tokens=8, logprobs=True)
    first = base.choices[0].logprobs.content[0]
    banned = llama_host.tokenize(first.token, add_bos=False)
    assert len(banned) == 1
    resp, _ = raw_chat(client, messages=Q, temperature=0, max_tokens=8, logprobs=True,
                       logit_bias={str(banned[0]): -100})
    assert resp.choices[0].logprobs.content[0].token != first.token


STORY = [{"role": "user", "content": "Tell me a story about a fox."}]


def _samples(client, seeds=range(4), **kw) -> set[str]:
    return {raw_chat(client, messages=STORY, temperature=1.5, max_tokens=12, seed=s, **kw)[0]
            .choices[0].message.content for s in seeds}


@pytest.mark.slow
def test_host_samplers_as_extra_fields(client):
    greedy = raw_chat(client, messages=STORY, temperature=0, max_tokens=12)[0].choices[0].message.content
    assert len(_samples(client)) > 1                       # hot sampling wanders ...
    assert _samples(client, extra_body={"top_k": 1}) == {greedy}      # ... top_k 1 keeps the likeliest
    assert _samples(client, extra_body={"min_p": 1.0}) == {greedy}    # and so does min_p 1
    # repetition_penalty really reaches the sampler
    rep, _ = raw_chat(client, messages=STORY, temperature=0, max_tokens=40, extra_body={"repetition_penalty": 1.8})
    assert rep.choices[0].message.content != raw_chat(client, messages=STORY, temperature=0, max_tokens=40)[0] \
        .choices[0].message.content


def test_top_p_narrows_sampling(client):
    greedy = raw_chat(client, messages=STORY, temperature=0, max_tokens=12)[0].choices[0].message.content
    assert _samples(client, top_p=1e-6) == {greedy}


def test_models_list_and_retrieve_the_loaded_model(sclient, scripted_host):
    ids = [m.id for m in sclient.models.list().data]
    assert ids[0] == scripted_host.model_id                   # the chat model comes first, by its real id
    model = sclient.models.retrieve(scripted_host.model_id)
    assert model.id == scripted_host.model_id and model.object == "model" and model.owned_by
    with pytest.raises(openai.NotFoundError) as e:
        sclient.models.retrieve("gpt-3.5-turbo")           # served by any name, but not listed as one
    assert e.value.body["code"] == "model_not_found"


def test_sdk_iterates_streams_with_n_and_include_usage(sclient):
    """The official client's own stream parsing (strict validation on): two choices, then usage."""
    stream = sclient.chat.completions.create(model="gpt-4o", messages=Q, temperature=1.0, max_tokens=6, n=2, seed=3,
                                            stream=True, stream_options={"include_usage": True})
    text, finish, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "length", 1: "length"} and all(text.values())
    assert usage.completion_tokens == 12 and usage.total_tokens == usage.prompt_tokens + 12


def test_presence_and_frequency_penalties_change_greedy_output(client):
    msgs = [{"role": "user", "content": "Repeat the word cat ten times."}]
    plain, _ = raw_chat(client, messages=msgs, temperature=0, max_tokens=30)
    penalised, _ = raw_chat(client, messages=msgs, temperature=0, max_tokens=30,
                            frequency_penalty=2.0, presence_penalty=2.0)
    assert plain.choices[0].message.content != penalised.choices[0].message.content


@pytest.mark.parametrize("kwargs, param", [
    (dict(messages=[]), "messages"),
    (dict(messages=Q, temperature=3), "temperature"),
    (dict(messages=Q, top_p=1.5), "top_p"),
    (dict(messages=Q, n=0), "n"),
    (dict(messages=Q, n=9), "n"),
    (dict(messages=Q, stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(messages=Q, top_logprobs=2), "top_logprobs"),
    (dict(messages=Q, top_logprobs=21, logprobs=True), "top_logprobs"),
    (dict(messages=Q, logit_bias={"abc": 1}), "logit_bias"),
    (dict(messages=Q, logit_bias={"99999999": 1}), "logit_bias"),
    (dict(messages=Q, stream_options={"include_usage": True}), "stream_options"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role"),
    (dict(messages=[{"role": "user"}]), "messages[0].content"),
    (dict(messages=[{"role": "tool", "content": "42"}]), "messages[0].tool_call_id"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]),
     "messages[0].content[0].type"),
    (dict(messages=Q, tools=[{"type": "code_interpreter"}]), "tools[0]"),
    (dict(messages=Q, response_format={"type": "xml"}), "response_format.type"),
    (dict(messages=Q, modalities=["text", "audio"]), "modalities"),
    (dict(messages=Q, audio={"voice": "alloy", "format": "mp3"}), "audio"),
    (dict(messages=Q, extra_body={"top_k": "many"}), "top_k"),
    (dict(messages=Q, extra_body={"tfs": 0.9}), "tfs"),
])
def test_bad_requests_get_openai_400s(sclient, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        sclient.chat.completions.create(model="x", **kwargs)
    err = e.value.body
    assert e.value.status_code == 400
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert_valid("ErrorResponse", e.value.response.json())


def test_prompt_longer_than_context_is_context_length_exceeded(sclient, scripted_host):
    long = "word " * (scripted_host.context_length() + 50)
    with pytest.raises(openai.BadRequestError) as e:
        sclient.chat.completions.create(model="x", messages=[{"role": "user", "content": long}], max_tokens=5)
    assert e.value.body["code"] == "context_length_exceeded"
    message = e.value.body["message"]
    assert str(scripted_host.context_length()) in message
    assert_longer_context_first(message, "truncate_prompt")


def assert_longer_context_first(message: str, truncation: str, *, web_ui: bool = False) -> None:
    """A prompt that cannot fit: the message names the real remedy first (a longer context, or a
    model with one), and only then the truncation that drops the oldest part of the prompt."""
    longer = "ctx-size" if web_ui else "--n-ctx"
    assert longer in message and "longer context" in message, message
    assert truncation in message and message.index(longer) < message.index(truncation), message


@pytest.mark.slow
def test_max_tokens_is_clamped_to_the_context(client, llama_host):
    prompt_len = len(llama_host.tokenize(llama_host.chat_prompt(Q).text))
    room = llama_host.context_length() - prompt_len
    resp, _ = raw_chat(client, messages=Q, temperature=0, max_tokens=room + 1000)
    assert resp.usage.completion_tokens <= room


@pytest.mark.slow  # loads a second server with a long prompt
def test_truncate_prompt_setting_cuts_instead(llama_host, make_server):
    from support.servers import openai_client

    server = make_server(llama_host, truncate_prompt=True)
    long = "word " * (llama_host.context_length() + 50)
    resp = openai_client(server).chat.completions.create(
        model="x", messages=[{"role": "user", "content": long}], max_tokens=4, temperature=0)
    assert resp.usage.prompt_tokens + 4 <= llama_host.context_length()
    assert resp.choices[0].finish_reason in ("length", "stop")


def test_routes_answer_without_v1_prefix(scripted):
    bare = scripted.url.removesuffix("/v1")
    r = httpx.post(f"{bare}/chat/completions", json={"messages": Q, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    assert_valid("CreateChatCompletionResponse", r.json())
    assert httpx.get(f"{bare}/models").json()["data"]


def test_a_message_list_that_cannot_fit_is_refused_before_it_is_rendered_and_others_are_served(scripted):
    """100,000 tiny messages (3.5 MB) used to keep the template and the tokenizer busy for
    minutes, and every other request waited; now the text's length alone refuses it."""
    import asyncio

    huge = {"model": "x", "messages": [{"role": "user", "content": "hi"}] * 100_000, "max_tokens": 1}
    small = {"model": "x", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3, "temperature": 0}

    async def run():
        async with httpx.AsyncClient(base_url=scripted.url, timeout=300) as c:
            return await asyncio.gather(c.post("/chat/completions", json=huge),
                                        c.post("/chat/completions", json=small))

    refused, served = asyncio.run(run())
    assert refused.status_code == 400, refused.text
    err = refused.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "characters" in err["message"]
    assert_longer_context_first(err["message"], "truncate_prompt")
    assert served.status_code == 200 and served.json()["choices"][0]["message"]["content"] is not None


def test_token_count_bounds_the_text_it_tokenizes(scripted):
    from openai_ext.admin.routes import MAX_TOKENIZE_CHARS

    ok = httpx.post(f"{scripted.url}/internal/token-count", json={"text": "<|im_end|>" * (MAX_TOKENIZE_CHARS // 10)})
    assert ok.status_code == 200 and ok.json()["length"] == MAX_TOKENIZE_CHARS // 10
    over = httpx.post(f"{scripted.url}/internal/token-count", json={"text": "a" * (MAX_TOKENIZE_CHARS + 1)})
    assert over.status_code == 400 and over.json()["error"]["param"] == "text"
