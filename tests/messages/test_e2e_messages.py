"""End to end: /v1/messages driven by the official anthropic client with strict response
validation, every body and event checked against the SDK's types; on the real SmolLM2 model where
the test is about what a model writes, on the scripted host where it is about the API's shape."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from support.anthropic_types import assert_events, assert_message, fold_text, strict
from support.servers import openai_client

Q = [{"role": "user", "content": "Name three colours of the rainbow."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
GREEDY = {"temperature": 0}   # the SDK has no temperature argument any more: sent as an extra field


def create(claude, **kw):
    """messages.create through the SDK, its raw body validated strictly as well."""
    raw = claude.messages.with_raw_response.create(model=kw.pop("model", "local-model"), **kw)
    assert_message(raw.http_response.json())
    return raw.parse(), raw.http_response.json()


def stream_events(live, **body):
    r = httpx.post(f"{live.url}/messages", json={"model": "x", "stream": True, **body}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return assert_events(r.text)


def prompt_tokens(host, messages):
    return len(host.tokenize(host.chat_prompt(messages).text))


def test_create_is_real_and_conformant(claude, llama_host):
    msg, body = create(claude, messages=Q, max_tokens=24, extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.model == llama_host.model_id            # the loaded model, whatever name was asked for
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text.strip()
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    # exact usage, from the model's own tokenizer; the cache fields as Anthropic sends them
    assert msg.usage.input_tokens == prompt_tokens(llama_host, Q)
    assert 0 < msg.usage.output_tokens <= 24
    assert body["usage"]["cache_creation_input_tokens"] == 0 and body["usage"]["cache_read_input_tokens"] == 0
    assert body["stop_sequence"] is None and "stop_sequence" in body


def test_max_tokens_gives_stop_reason_max_tokens_with_exactly_that_many(sclaude, scripted):
    msg, _ = create(sclaude, messages=STORY, max_tokens=7, extra_body=GREEDY)
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 7
    events = stream_events(scripted, messages=STORY, max_tokens=7, **GREEDY)
    assert events[-2]["delta"]["stop_reason"] == "max_tokens" and events[-2]["usage"]["output_tokens"] == 7
    assert fold_text(events) == msg.content[0].text


def test_natural_end_is_end_turn(sclaude):
    msg, _ = create(sclaude, messages=[{"role": "user", "content": "Say hi."}], max_tokens=200, extra_body=GREEDY)
    assert msg.stop_reason == "end_turn" and msg.usage.output_tokens < 200


def test_system_prompt_string_and_blocks_reach_the_model(sclaude, scripted_host):
    system = "You are a pirate. Always answer like a pirate."
    as_string = sclaude.messages.count_tokens(model="x", system=system, messages=Q)
    as_blocks = sclaude.messages.count_tokens(model="x", system=[{"type": "text", "text": system}], messages=Q)
    expected = prompt_tokens(scripted_host, [{"role": "system", "content": system}, *Q])
    assert as_string.input_tokens == as_blocks.input_tokens == expected
    msg, _ = create(sclaude, system=system, messages=Q, max_tokens=5, extra_body=GREEDY)
    assert msg.usage.input_tokens == expected


def test_stream_events_are_anthropics_sequence_and_match_create(sclaude, scripted, scripted_host):
    whole, _ = create(sclaude, messages=Q, max_tokens=30, extra_body=GREEDY)
    r = httpx.post(f"{scripted.url}/messages", json={"model": "x", "stream": True, "messages": Q, "max_tokens": 30,
                                                  **GREEDY}, timeout=120)
    events = assert_events(r.text)
    assert "event: ping\ndata: {\"type\":\"ping\"}" in r.text and "[DONE]" not in r.text
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["model"] == scripted_host.model_id
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens
    assert [e["type"] for e in events[1:3]] == ["content_block_start", "content_block_delta"]
    assert events[1]["content_block"] == {"type": "text", "text": ""}
    assert fold_text(events) == whole.content[0].text
    end = events[-2]
    assert end["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert end["usage"]["output_tokens"] == whole.usage.output_tokens


def test_sdk_stream_helpers(sclaude):
    with sclaude.messages.stream(model="x", max_tokens=40, messages=[{"role": "user", "content": "Say hi."}],
                                extra_body=GREEDY) as s:
        texts = list(s.text_stream)
        final = s.get_final_message()
    assert texts and "".join(texts) == final.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    with sclaude.messages.stream(model="x", max_tokens=10, messages=STORY, extra_body=GREEDY) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "text" in kinds
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    strict(anthropic.types.Message, final.model_dump(mode="json", exclude_unset=True))


def test_raw_sdk_stream_iterates_typed_events(sclaude):
    stream = sclaude.messages.create(model="x", max_tokens=8, messages=STORY, stream=True, extra_body=GREEDY)
    kinds = [type(e).__name__ for e in stream]
    assert kinds[0] == "RawMessageStartEvent" and kinds[-2:] == ["RawMessageDeltaEvent", "RawMessageStopEvent"]
    assert "RawContentBlockDeltaEvent" in kinds


def _greedy_tokens(live, messages, n):
    resp = openai_client(live).chat.completions.create(model="x", messages=messages, temperature=0, max_tokens=n,
                                                       logprobs=True)
    return [t.token for t in resp.choices[0].logprobs.content]


def test_stop_sequence_split_across_tokens(sclaude, scripted):
    tokens = _greedy_tokens(scripted, STORY, 40)
    text = "".join(tokens)
    boundary = len(tokens[0]) + len(tokens[1]) + len(tokens[2])
    assert len(tokens[3]) >= 2, tokens
    stop = text[boundary - 2:boundary + 2]          # starts inside one token, ends inside the next
    expected = text[:text.find(stop)]
    stops = ["never-happens", stop, "qqq1", "qqq2", "qqq3"]   # more than chat's four: Anthropic has no limit
    msg, body = create(sclaude, messages=STORY, max_tokens=40, stop_sequences=stops, extra_body=GREEDY)
    assert msg.content[0].text == expected
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop and body["stop_sequence"] == stop
    events = stream_events(scripted, messages=STORY, max_tokens=40, stop_sequences=stops, **GREEDY)
    deltas = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(deltas) == expected and all(stop not in d for d in deltas)
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_end_of_turn_is_not_a_stop_sequence(sclaude):
    # the template's own end-of-turn string ends the reply, but the client did not ask for it
    msg, _ = create(sclaude, messages=[{"role": "user", "content": "Say hi."}], max_tokens=100,
                    stop_sequences=["never-happens"], extra_body=GREEDY)
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None


def test_count_tokens_matches_the_prompt_of_create(sclaude, scripted_host):
    history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
               {"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "a joke."}]}]
    counted = sclaude.messages.count_tokens(model="x", messages=history)
    strict(anthropic.types.MessageTokensCount, counted.model_dump())
    msg, _ = create(sclaude, messages=history, max_tokens=3, extra_body=GREEDY)
    assert counted.input_tokens == msg.usage.input_tokens
    flat = [history[0], history[1], {"role": "user", "content": "Tell me\na joke."}]
    assert counted.input_tokens == prompt_tokens(scripted_host, flat)


def test_prefill_is_continued(sclaude, scripted_host):
    turns = [{"role": "user", "content": "What is the capital of France?"},
             {"role": "assistant", "content": "The capital of France is"}]
    msg, _ = create(sclaude, messages=turns, max_tokens=8, extra_body=GREEDY)
    assert not msg.content[0].text.startswith("The capital")   # the prefill itself is not repeated
    rendered = scripted_host.chat_prompt(turns[:1]).text + turns[1]["content"]
    assert msg.usage.input_tokens == len(scripted_host.tokenize(rendered))


def test_thinking_with_a_model_without_reasoning_mode(sclaude):
    msg, _ = create(sclaude, messages=Q, max_tokens=2000, extra_body=GREEDY,
                    thinking={"type": "enabled", "budget_tokens": 1024})
    assert msg.content and all(b.type == "text" for b in msg.content)   # no thinking blocks
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "greet back", "signature": "s"},
                                                 {"type": "redacted_thinking", "data": "xyz"},
                                                 {"type": "text", "text": "Hello!"}]},
               {"role": "user", "content": "Name a colour."}]
    with_thinking = sclaude.messages.count_tokens(model="x", messages=history)
    history[1]["content"] = "Hello!"
    assert with_thinking.input_tokens == sclaude.messages.count_tokens(model="x", messages=history).input_tokens


def test_metadata_top_k_and_top_p_are_accepted(sclaude):
    base, _ = create(sclaude, messages=STORY, max_tokens=12, extra_body=GREEDY)
    # top_k 1 is greedy whatever the temperature
    msg, _ = create(sclaude, messages=STORY, max_tokens=12, metadata={"user_id": "u-1"},
                    extra_body={"temperature": 1, "top_k": 1, "top_p": 0.9})
    assert msg.content[0].text == base.content[0].text


def test_models_in_anthropics_shape_for_anthropic_clients(sclaude, scripted, scripted_host):
    page = sclaude.models.list()
    raw = httpx.get(f"{scripted.url}/models", headers={"anthropic-version": "2023-06-01"}).json()
    assert set(raw) == {"data", "has_more", "first_id", "last_id"}
    for item in raw["data"]:
        strict(anthropic.types.ModelInfo, item)
    assert [m.id for m in page.data] == [scripted_host.model_id] and page.data[0].type == "model"
    assert raw["first_id"] == raw["last_id"] == scripted_host.model_id and raw["has_more"] is False
    model = sclaude.models.retrieve(scripted_host.model_id)
    assert model.id == scripted_host.model_id and model.display_name
    with pytest.raises(anthropic.NotFoundError) as e:
        sclaude.models.retrieve("claude-sonnet-4-5")
    assert e.value.body["error"]["type"] == "not_found_error"
    # without the header, the OpenAI shape as before
    assert httpx.get(f"{scripted.url}/models").json()["object"] == "list"


def test_routes_answer_without_v1_prefix(scripted):
    bare = scripted.url.removesuffix("/v1")
    r = httpx.post(f"{bare}/messages", json={"model": "x", "messages": Q, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    assert_message(r.json())


def test_output_config_format_gives_json_that_follows_the_schema(claude):
    import json

    from jsonschema import Draft202012Validator

    schema = {"type": "object", "properties": {"colours": {"type": "array", "items": {"type": "string"},
                                                           "minItems": 1, "maxItems": 3}},
              "required": ["colours"], "additionalProperties": False}
    msg, _ = create(claude, messages=Q, max_tokens=100, extra_body=GREEDY,
                    output_config={"format": {"type": "json_schema", "schema": schema}})
    assert msg.stop_reason == "end_turn"
    assert Draft202012Validator(schema).is_valid(json.loads(msg.content[0].text))
