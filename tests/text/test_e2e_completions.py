"""End to end: /v1/completions driven by the official client, on the scripted host (the API's
shape) and on the real SmolLM2 model (best_of, and the scores of an echoed prompt)."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.spec import assert_valid, assert_valid_stream

PROMPT = "Once upon a time"


def raw_completion(client, **kw):
    raw = client.completions.with_raw_response.create(model="text-davinci-003", **kw)
    body = raw.http_response.json()
    assert_valid("CreateCompletionResponse", body)
    return raw.parse(), body


def stream(live, **body):
    r = httpx.post(f"{live.url}/completions", json={"model": "x", "stream": True, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return assert_valid_stream("CreateCompletionStreamResponse", r.text)


def test_completion_default_max_tokens_is_16(sclient, scripted_host):
    resp, body = raw_completion(sclient, prompt=PROMPT, temperature=0)
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.model == scripted_host.model_id
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 16
    assert resp.usage.prompt_tokens == len(scripted_host.tokenize(PROMPT))
    assert body["choices"][0]["logprobs"] is None


def test_token_id_prompts_equal_text_prompts(sclient, scripted_host):
    ids = scripted_host.tokenize(PROMPT)
    by_text, _ = raw_completion(sclient, prompt=PROMPT, temperature=0, max_tokens=8)
    by_ids, _ = raw_completion(sclient, prompt=ids, temperature=0, max_tokens=8)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_several_prompts_give_indexed_choices(client):
    resp, _ = raw_completion(client, prompt=["The sky is", "Water is"], temperature=0, max_tokens=4, n=2)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    # greedy: both choices of one prompt agree, and the two prompts differ
    assert resp.choices[0].text == resp.choices[1].text != resp.choices[2].text == resp.choices[3].text
    assert resp.usage.completion_tokens == 16


def test_list_of_token_lists(sclient, scripted_host):
    ids = [scripted_host.tokenize("The sky is"), scripted_host.tokenize("Water is")]
    resp, _ = raw_completion(sclient, prompt=ids, temperature=0, max_tokens=3)
    assert len(resp.choices) == 2


def test_echo_and_logprobs(client, llama_host):
    resp, body = raw_completion(client, prompt=PROMPT, temperature=0, max_tokens=5, echo=True, logprobs=2)
    choice = resp.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    n_prompt = len(llama_host.tokenize(PROMPT))
    assert len(lp.tokens) == n_prompt + 5
    # every token carries a real score, the first one scored as the start of a document
    assert all(x <= 0 for x in lp.token_logprobs)
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    # the two most likely tokens, plus the chosen one when it is not among them
    for token, score, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=False):
        assert 2 <= len(top) <= 3 and top[token] == score
    # greedy generation: each generated token is the most likely one
    for token, top in zip(lp.tokens[n_prompt:], lp.top_logprobs[n_prompt:], strict=False):
        assert max(top, key=top.get) == token


def test_logprobs_without_echo(sclient):
    resp, _ = raw_completion(sclient, prompt=PROMPT, temperature=0, max_tokens=4, logprobs=0)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == 4 and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == resp.choices[0].text
    # logprobs=0 asks for no alternatives: each entry holds just the chosen token
    assert all(top == {tok: score} for tok, score, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=False))


def test_echo_without_logprobs_streams_prompt_first(scripted):
    chunks = stream(scripted, prompt=PROMPT, temperature=0, max_tokens=4, echo=True)
    assert chunks[0]["choices"][0]["text"] == PROMPT
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_stream_matches_and_includes_usage(scripted, sclient):
    full, _ = raw_completion(sclient, prompt=PROMPT, temperature=0, max_tokens=12)
    chunks = stream(scripted, prompt=PROMPT, temperature=0, max_tokens=12, stream_options={"include_usage": True})
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == full.choices[0].text
    assert all("usage" not in c for c in chunks[:-1])  # the spec has no null usage for completions
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full.usage.model_dump(exclude_none=True)


def test_stream_logprobs_text_offsets_are_absolute(scripted):
    chunks = stream(scripted, prompt=PROMPT, temperature=0, max_tokens=6, logprobs=1)
    offsets, tokens = [], []
    for c in chunks:
        lp = c["choices"][0]["logprobs"]
        if lp:
            offsets += lp["text_offset"]
            tokens += lp["tokens"]
    assert len(tokens) == 6
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(6)]


def _mean_logprob(choice) -> float:
    lps = choice.logprobs.token_logprobs
    return sum(lps) / len(lps)


@pytest.mark.parametrize("n", [1, 2])
def test_best_of_returns_the_most_likely_candidates(client, n):
    # The same seeded request with n=3 shows every candidate and its log-probabilities:
    # candidate i is sampled with seed + i either way.
    kw = dict(prompt=PROMPT, temperature=1.5, max_tokens=6, seed=11)
    every, _ = raw_completion(client, n=3, logprobs=0, **kw)
    ranked = sorted(every.choices, key=_mean_logprob, reverse=True)
    assert len({c.text for c in every.choices}) == 3   # the candidates really differ
    # Without logprobs in the request, the ranking still uses them, and none are returned.
    resp, body = raw_completion(client, best_of=3, n=n, **kw)
    assert [c.text for c in resp.choices] == [c.text for c in ranked[:n]]
    assert [c.index for c in resp.choices] == list(range(n))
    assert all(c["logprobs"] is None for c in body["choices"])
    assert resp.usage.completion_tokens == every.usage.completion_tokens   # all three were generated


def test_stop_string_split_across_tokens_in_a_completion_stream(scripted, sclient, scripted_host):
    base, _ = raw_completion(sclient, prompt=PROMPT, temperature=0, max_tokens=24)
    text = base.choices[0].text
    # a stop string that starts inside one token and ends inside the next
    tokens = [scripted_host.detokenize([t]) for t in scripted_host.tokenize(PROMPT + text, add_bos=False)]
    joined, at = "", []
    for t in tokens:
        joined += t
        at.append(len(joined))
    cut = next(a for a in at if len(PROMPT) + 6 < a < len(PROMPT + text) - 4 and len(tokens[at.index(a)]) >= 2)
    stop = (PROMPT + text)[cut - 1:cut + 2]
    assert stop in text
    chunks = stream(scripted, prompt=PROMPT, temperature=0, max_tokens=24, stop=[stop])
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert streamed == text[:text.find(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_in_completions(sclient):
    base, _ = raw_completion(sclient, prompt=PROMPT, temperature=0, max_tokens=20)
    text = base.choices[0].text
    stop = text[5:8]
    resp, _ = raw_completion(sclient, prompt=PROMPT, temperature=0, max_tokens=20, stop=stop)
    assert resp.choices[0].text == text[:text.find(stop)] and resp.choices[0].finish_reason == "stop"


def test_max_tokens_zero_returns_empty_length(sclient):
    resp, _ = raw_completion(sclient, prompt=PROMPT, max_tokens=0)
    assert resp.choices[0].text == "" and resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 0


@pytest.mark.parametrize("kwargs, param", [
    (dict(prompt=PROMPT, logprobs=6), "logprobs"),
    (dict(prompt=PROMPT, best_of=1, n=2), "best_of"),
    (dict(prompt=PROMPT, best_of=3, stream=True), "best_of"),
    (dict(prompt=PROMPT, suffix="The end."), "suffix"),
    (dict(prompt=[10 ** 9]), "prompt"),
    (dict(prompt=[]), "prompt"),
    (dict(prompt=PROMPT, max_tokens=-1), "max_tokens"),
    (dict(prompt=PROMPT, presence_penalty=3), "presence_penalty"),
])
def test_completion_errors(sclient, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        sclient.completions.create(model="x", **kwargs)
    assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"
    assert_valid("ErrorResponse", e.value.response.json())


def test_prompt_over_context(sclient, scripted_host):
    with pytest.raises(openai.BadRequestError) as e:
        sclient.completions.create(model="x", prompt="hi " * (scripted_host.context_length() + 10))
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    message = e.value.body["message"]   # a longer context first, then truncation
    assert "--n-ctx" in message and message.index("--n-ctx") < message.index("truncate_prompt"), message


def test_an_empty_prompt_starts_a_new_document(sclient):
    resp, _ = raw_completion(sclient, prompt="", max_tokens=5, temperature=0)
    assert resp.usage.prompt_tokens == 1 and resp.usage.completion_tokens >= 1
    resp, _ = raw_completion(sclient, prompt=["", "Hi"], max_tokens=2, temperature=0)
    assert len(resp.choices) == 2


def test_a_prompt_that_cannot_fit_is_refused_from_its_length(scripted, scripted_host):
    limit = scripted_host.context_length() * scripted_host.max_token_bytes
    r = httpx.post(f"{scripted.url}/completions", json={"model": "x", "prompt": "a" * (limit + 1), "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded" and r.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("n", [1, 2])
def test_a_completion_stream_ends_each_choice_with_an_empty_chunk_carrying_finish_reason(scripted, script, n):
    """As OpenAI's legacy completions stream does: one chunk per piece of text with
    finish_reason null, then for each choice one chunk with text "" and the finish_reason (so a
    stream of max_tokens tokens has max_tokens text chunks and one more), then usage's chunk
    (choices []) when stream_options asks for it, then [DONE]."""
    script.default = "one two three four five six seven eight"
    chunks = stream(scripted, prompt=PROMPT, max_tokens=5, n=n, stream_options={"include_usage": True})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5 * n
    for i in range(n):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == i]
        texts, last = mine[:-1], mine[-1]
        assert len(texts) == 5 and all(c["text"] and c["finish_reason"] is None for c in texts)
        assert (last["text"], last["finish_reason"]) == ("", "length")
        assert "".join(c["text"] for c in texts) == "one two three four five"
