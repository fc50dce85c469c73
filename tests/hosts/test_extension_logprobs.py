"""Log-probabilities from the web UI's loaders (the double reports them as the host's do: the
llama.cpp loader's last_completion_probabilities, one token behind the text; the Transformers
path's logits processor, which sees a token only at the next step)."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.spec import assert_valid, assert_valid_stream

LOADERS = ["llama.cpp", "Transformers"]


@pytest.fixture
def client(extension):
    return openai.OpenAI(base_url=extension.server.url, api_key="x", max_retries=0,
                         _strict_response_validation=True, timeout=30)


def use_loader(host_modules, loader):
    """The web UI with another loader's model loaded (as its Model tab would)."""
    host_modules.shared.args.loader = loader
    host_modules.shared.model, host_modules.shared.tokenizer = host_modules.models.new_model(loader)


def expected(tg, tokens, top):
    """(token, logprob, top alternatives) the double's distribution gives each generated token."""
    out = []
    for step, token in enumerate(tokens):
        tid = tg.token_id(token)
        lps = tg.log_softmax(tg.distribution(step, tid))
        best = sorted(lps.items(), key=lambda kv: -kv[1])[:top]
        out.append((tg.token_bytes(tid), pytest.approx(lps[tid], abs=1e-5),
                    [(tg.token_bytes(t), pytest.approx(lp, abs=1e-5)) for t, lp in best]))
    return out


def seen(content):
    return [(bytes(c["bytes"]), c["logprob"], [(bytes(t["bytes"]), t["logprob"]) for t in c["top_logprobs"]])
            for c in content]


@pytest.mark.parametrize("loader", LOADERS)
def test_chat_logprobs_come_from_the_host(client, host_modules, loader):
    use_loader(host_modules, loader)
    tg = host_modules.text_generation
    raw = client.chat.completions.with_raw_response.create(
        model="x", messages=[{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=2)
    body = raw.http_response.json()
    assert_valid("CreateChatCompletionResponse", body)
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hello, world!"
    assert seen(choice["logprobs"]["content"]) == expected(tg, tg.SCRIPT, 2)
    assert "".join(c["token"] for c in choice["logprobs"]["content"]) == "Hello, world!"
    assert tg.CALLS[-1][1]["logprobs"] == 2                  # asked of the host, as its own API does
    assert body["usage"]["completion_tokens"] >= len(tg.SCRIPT)


@pytest.mark.parametrize("loader", LOADERS)
def test_streamed_logprobs_travel_with_their_text(extension, host_modules, loader):
    use_loader(host_modules, loader)
    tg = host_modules.text_generation
    tg.SCRIPT = ["The", " sky", " is", " blue", ".", " Done"]
    r = httpx.post(f"{extension.server.url}/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "stream": True, "logprobs": True,
                         "top_logprobs": 1, "stop": [" Do"]})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    content, tokens = "", []
    for chunk in chunks:
        choice = chunk["choices"][0]
        text = choice["delta"].get("content") or ""
        listed = [c["token"] for c in (choice["logprobs"] or {}).get("content") or []]
        assert "".join(listed) == text   # each chunk's tokens are exactly its text
        content += text
        tokens += listed
    assert content == "The sky is blue." and tokens == ["The", " sky", " is", " blue", "."]


@pytest.mark.parametrize("loader", LOADERS)
def test_a_reply_cut_at_max_tokens_has_its_last_token_scored(client, host_modules, loader):
    """The Transformers path sees the last token in no later call: it is scored at the end."""
    use_loader(host_modules, loader)
    tg = host_modules.text_generation
    resp = client.completions.create(model="x", prompt="p", max_tokens=3, logprobs=1)
    choice = resp.choices[0]
    assert choice.text == "Hello, world" and choice.finish_reason == "length"
    assert choice.logprobs.tokens == ["Hello", ",", " world"]
    assert choice.logprobs.token_logprobs == [e[1] for e in expected(tg, tg.SCRIPT[:3], 1)]
    assert choice.logprobs.text_offset == [0, 5, 6]


@pytest.mark.parametrize("loader", LOADERS)
def test_a_character_split_across_tokens_keeps_its_bytes(client, host_modules, loader):
    use_loader(host_modules, loader)
    tg = host_modules.text_generation
    smile = "\U0001F600".encode()
    tg.SCRIPT = ["Hi ", smile[:2], smile[2:], "!"]
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}],
                                          logprobs=True, top_logprobs=0)
    content = resp.choices[0].logprobs.content
    assert resp.choices[0].message.content == "Hi \U0001F600!"
    assert [bytes(c.bytes) for c in content] == [b"Hi ", smile[:2], smile[2:], b"!"]
    assert all(c.top_logprobs == [] for c in content)


def test_logprobs_survive_yields_the_host_drops(client, host_modules):
    """The host drops yields closer than 1 ms apart: the text comes in fewer, larger steps
    than the tokens, and each token still gets its own entry."""
    tg = host_modules.text_generation
    tg.TOKEN_SECONDS = 0
    tg.SCRIPT = [f" w{i}" for i in range(40)]
    resp = client.completions.create(model="x", prompt="p", max_tokens=40, logprobs=0)
    assert resp.choices[0].logprobs.tokens == tg.SCRIPT
    assert resp.choices[0].text == "".join(tg.SCRIPT)
    assert resp.usage.completion_tokens >= 40


@pytest.mark.parametrize("loader", LOADERS)
def test_echo_scores_the_prompt_through_the_host(extension, host_modules, loader):
    use_loader(host_modules, loader)
    tg = host_modules.text_generation
    tg.PROMPT_LOGPROBS = True   # a llama-server built with prompt_logprobs
    tg.SCRIPT = ["!"]
    r = httpx.post(f"{extension.server.url}/completions", timeout=30,
                   json={"prompt": "Hi you", "max_tokens": 1, "echo": True, "logprobs": 1})
    body = r.json()
    assert_valid("CreateCompletionResponse", body)
    lp = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"] == "Hi you!"
    assert lp["tokens"] == list("Hi you") + ["!"]          # the start token is scored against, not shown
    assert lp["text_offset"] == list(range(7))
    ids = [tg.BOS, *b"Hi you"]
    for j, value in enumerate(lp["token_logprobs"][:6]):   # row j of the prompt scores token j + 1
        assert value == pytest.approx(tg.log_softmax(tg.distribution(1000 + j, ids[j + 1]))[ids[j + 1]], abs=1e-5)


def test_loaders_that_cannot_give_them_are_refused_by_name(client, host_modules):
    use_loader(host_modules, "TensorRT-LLM")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}], logprobs=True)
    assert e.value.body["param"] == "logprobs"
    use_loader(host_modules, "ExLlamav3")   # reports them while generating, cannot score a prompt
    ok = client.completions.create(model="x", prompt="p", max_tokens=2, logprobs=1)
    assert ok.choices[0].logprobs.tokens == ["Hello", ","]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="x", prompt="p", max_tokens=2, logprobs=1, echo=True)
    assert e.value.body["param"] == "echo"


def test_best_of_ranks_by_the_hosts_logprobs(client, host_modules):
    resp = client.completions.create(model="x", prompt="p", max_tokens=2, best_of=2, n=1, seed=1)
    assert resp.choices[0].text == "Hello,"


# --- /v1/internal/logits -------------------------------------------------------------------------

@pytest.mark.parametrize("loader", LOADERS)
def test_internal_logits_come_from_the_hosts_own_function(extension, host_modules, loader):
    use_loader(host_modules, loader)
    tg = host_modules.text_generation
    r = httpx.post(f"{extension.server.url}/internal/logits", json={"prompt": "Hi", "top_logits": 3}, timeout=30)
    assert r.status_code == 200, r.text
    logits = r.json()["logits"]
    lps = tg.log_softmax(tg.distribution(3, tg.token_id("Hello")))   # after <s>Hi
    best = sorted(lps.items(), key=lambda kv: -kv[1])[:3]
    assert list(logits.values()) == [pytest.approx(2.718281828 ** lp) for _, lp in best]
    assert list(logits)[0] == "Hello"
    assert host_modules.logits.CALLS[-1] == ("Hi", False, 3)
    assert not host_modules.shared.generation_lock.locked()


def test_internal_logits_with_samplers_take_the_requests_settings(extension, host_modules):
    r = httpx.post(f"{extension.server.url}/internal/logits", timeout=30,
                   json={"prompt": "Hi", "top_logits": 2, "use_samplers": True, "temperature": 0.5, "top_k": 4})
    assert r.status_code == 200 and len(r.json()["logits"]) == 2
    assert host_modules.logits.CALLS[-1] == ("Hi", True, 2)
    bad = httpx.post(f"{extension.server.url}/internal/logits", json={"prompt": "Hi", "top_kk": 4}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_kk"


def test_internal_logits_failure_is_an_error_object(extension, host_modules):
    host_modules.text_generation.FAIL_AFTER = 0   # the host logs the failure and returns None
    r = httpx.post(f"{extension.server.url}/internal/logits", json={"prompt": "Hi"}, timeout=30)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
