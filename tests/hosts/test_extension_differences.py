"""Where extension mode differed from standalone and from the web UI's own API (issue 26): echo
on a llama-server that cannot score prompts, the end token's entry, chat mode's leading space,
the stop string's tokens in usage, and an error message's grammar."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.spec import assert_valid, assert_valid_stream


@pytest.fixture
def client(extension):
    return openai.OpenAI(base_url=extension.server.url, api_key="x", max_retries=0,
                         _strict_response_validation=True, timeout=30)


def test_echo_with_logprobs_is_a_400_when_the_llama_server_cannot_score_prompts(client, extension, host_modules):
    tg = host_modules.text_generation
    assert host_modules.shared.args.loader == "llama.cpp" and not tg.PROMPT_LOGPROBS
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="x", prompt="Hi you", max_tokens=1, logprobs=1, echo=True, stream=stream)
        assert e.value.body["param"] == "echo"
        assert "prompt_logprobs" in e.value.body["message"] and "Transformers" in e.value.body["message"]
    # echo alone, and logprobs alone, still work
    assert client.completions.create(model="x", prompt="Hi", max_tokens=1, echo=True).choices[0].text == "HiHello"
    assert client.completions.create(model="x", prompt="Hi", max_tokens=1, logprobs=1).choices[0].logprobs.tokens \
        == ["Hello"]
    # a server that scores prompts is asked again once another model is loaded
    host_modules.shared.model, _ = host_modules.models.new_model("llama.cpp")
    tg.PROMPT_LOGPROBS = True
    r = httpx.post(f"{extension.server.url}/completions", timeout=30,
                   json={"prompt": "Hi", "max_tokens": 1, "echo": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"]["tokens"] == ["H", "i", "Hello"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_end_token_gets_no_entry(extension, host_modules, stream):
    """llama-server reports the end-of-text token as a token that sent no text."""
    tg = host_modules.text_generation
    tg.SCRIPT = ["The", " sky", " is", " blue", ".", " Done", "!"]
    r = httpx.post(f"{extension.server.url}/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 1,
                         "stream": stream, "stream_options": {"include_usage": True} if stream else None})
    if stream:
        chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
        content = [c for ch in chunks if ch["choices"] for c in ((ch["choices"][0]["logprobs"] or {}).get("content")
                                                                  or [])]
    else:
        assert_valid("CreateChatCompletionResponse", r.json())
        content = r.json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == tg.SCRIPT   # seven tokens, seven entries


def test_chat_mode_replies_do_not_start_with_a_space(client, host_modules):
    """The web UI's chat modes strip the space the model writes after "Name:"."""
    tg = host_modules.text_generation
    for mode in ("chat", "chat-instruct"):
        tg.SCRIPT = [" ", " Arr", ",", " matey", "."]
        resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                              extra_body={"mode": mode, "character": "Pirate"})
        assert resp.choices[0].message.content == "Arr, matey."
        assert resp.usage.completion_tokens >= 5   # the spaces were generated: they count
    tg.SCRIPT = [" Arr", "."]
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}])
    assert resp.choices[0].message.content == " Arr."   # instruct mode keeps the model's text as it is


def test_completion_tokens_leave_out_the_stop_strings_tokens(client, host_modules):
    tg = host_modules.text_generation
    tg.SCRIPT = ["Yes", ".", "<|im_end|>", "more"]   # the template's stop string as one token
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}])
    assert (resp.choices[0].message.content, resp.usage.completion_tokens) == ("Yes.", 2)
    tg.SCRIPT = ["a", "b", "END", "c"]
    resp = client.completions.create(model="x", prompt="p", stop=["END"], max_tokens=10)
    assert (resp.choices[0].text, resp.usage.completion_tokens) == ("ab", 2)


def test_an_over_long_prompt_is_named_in_good_grammar(client, host_modules):
    host_modules.shared.settings["truncation_length"] = 8
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="x", prompt="a prompt too long", max_tokens=1)
    # (worded so that the verb agrees whatever the name: the Responses API's is "input")
    assert " tokens are taken by the prompt alone." in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "a long question"}])
    assert " tokens are taken by the messages alone." in e.value.body["message"]
