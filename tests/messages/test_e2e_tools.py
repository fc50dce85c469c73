"""Tool use through /v1/messages, all through the official anthropic client: on the real model,
grammar-enforced input, streamed input and a whole tool round trip; on the scripted host,
tool_choice none and auto, and the refusals."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from jsonschema import Draft202012Validator
from support.anthropic_types import assert_error, assert_events, assert_message
from support.scripted import call, forced

WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                             "unit": {"enum": ["celsius", "fahrenheit"]}},
                            "required": ["city"], "additionalProperties": False}}
BOOKING = {"name": "book_trip", "description": "Book a trip for travellers",
           "input_schema": {
               "type": "object",
               "properties": {
                   "destination": {"type": "object",
                                   "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                                   "required": ["city", "country"], "additionalProperties": False},
                   "travellers": {"type": "array", "minItems": 1, "maxItems": 3,
                                  "items": {"type": "object",
                                            "properties": {"name": {"type": "string"},
                                                           "age": {"type": "integer"}},
                                            "required": ["name", "age"], "additionalProperties": False}},
                   "class": {"enum": ["economy", "business"]}},
               "required": ["destination", "travellers", "class"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TRIP = [{"role": "user", "content": "Book a business trip to Rome, Italy for Ann, 34."}]
GREEDY = {"temperature": 0}


def create(claude, **kw):
    raw = claude.messages.with_raw_response.create(model="local-model", **kw)
    assert_message(raw.http_response.json())
    return raw.parse()


def valid(tool, value) -> bool:
    return Draft202012Validator(tool["input_schema"]).is_valid(value)


def test_tool_round_trip_with_tool_choice_any(claude):
    first = create(claude, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=200,
                   extra_body=GREEDY)
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and uses
    for use in uses:
        assert use.name == "get_weather" and use.id.startswith("toolu_") and valid(WEATHER, use.input)
    assert len({u.id for u in uses}) == len(uses)
    # the results go back as tool_result blocks, one an error; then the model answers in text
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": "18 degrees celsius, sunny"} for u in uses]
    results[-1] = {**results[-1], "content": [{"type": "text", "text": "station offline"}], "is_error": True}
    turns = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": results}]
    answer = create(claude, messages=turns, tools=[WEATHER], tool_choice={"type": "none"}, max_tokens=60,
                    extra_body=GREEDY)
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text.strip()
    assert answer.stop_reason in ("end_turn", "max_tokens")
    counted = claude.messages.count_tokens(model="x", messages=turns, tools=[WEATHER], tool_choice={"type": "none"})
    assert counted.input_tokens == answer.usage.input_tokens


def test_named_tool_with_a_nested_schema_always_validates(claude, live):
    msg = create(claude, messages=TRIP, tools=[WEATHER, BOOKING], tool_choice={"type": "tool", "name": "book_trip"},
                 max_tokens=300, extra_body=GREEDY)
    assert [b.type for b in msg.content] == ["tool_use"] and msg.stop_reason == "tool_use"   # one call, named
    assert msg.content[0].name == "book_trip" and valid(BOOKING, msg.content[0].input)
    # the same, streamed: the input arrives in the fragments it was generated in
    r = httpx.post(f"{live.url}/messages", timeout=120, json={
        "model": "x", "messages": TRIP, "tools": [WEATHER, BOOKING], "max_tokens": 300, "stream": True,
        "tool_choice": {"type": "tool", "name": "book_trip"}, **GREEDY})
    events = assert_events(r.text)
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["tool_use"]
    assert starts[0]["content_block"]["input"] == {} and starts[0]["content_block"]["name"] == "book_trip"
    fragments = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert len(fragments) > 3 and all(e["delta"]["type"] == "input_json_delta"
                                      for e in events if e["type"] == "content_block_delta")
    streamed = json.loads("".join(fragments))
    assert valid(BOOKING, streamed) and streamed == msg.content[0].input
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_disable_parallel_tool_use_gives_one_call(claude):
    msg = create(claude, messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}], tools=[WEATHER],
                 tool_choice={"type": "any", "disable_parallel_tool_use": True}, max_tokens=300, extra_body=GREEDY)
    assert [b.type for b in msg.content] == ["tool_use"] and valid(WEATHER, msg.content[0].input)


def test_sdk_stream_helper_accumulates_tool_input(claude):
    with claude.messages.stream(model="x", messages=ASK, tools=[WEATHER], tool_choice={"type": "any"},
                                max_tokens=200, extra_body=GREEDY) as s:
        snapshots = [e.snapshot for e in s if e.type == "input_json"]
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and all(valid(WEATHER, u.input) for u in uses) and final.stop_reason == "tool_use"
    assert snapshots and snapshots[-1] == uses[-1].input


def test_tool_choice_none_and_auto(sclaude):
    none = create(sclaude, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"}, max_tokens=30,
                  extra_body=GREEDY)
    assert all(b.type == "text" for b in none.content) and none.stop_reason != "tool_use"
    auto = create(sclaude, messages=ASK, tools=[WEATHER], max_tokens=200, extra_body=GREEDY)
    for b in auto.content:   # whatever the model chooses, a call is valid, and says so
        assert b.type == "text" or valid(WEATHER, b.input)
    assert (auto.stop_reason == "tool_use") == any(b.type == "tool_use" for b in auto.content)


@pytest.mark.parametrize("kw, says", [
    (dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "web_search_20250305"),
    (dict(tools=[{"type": "bash_20250124", "name": "bash"}]), "bash_20250124"),
    (dict(tools=[{"name": "bad name!", "input_schema": {"type": "object"}}]), "tools[0].name"),
    (dict(tools=[{"name": "f", "input_schema": {"type": "array"}}]), "tools[0].input_schema"),
    (dict(tools=[{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": 12}}}}]),
     "tools[0].input_schema"),
    (dict(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), "nope"),
    (dict(tools=[{"name": "f", "strict": True, "input_schema": {"type": "object", "properties": {"n": {
        "type": "integer", "minimum": 1, "multipleOf": 2}}}}],
          tool_choice={"type": "any"}), "tools[0].input_schema.properties.n.multipleOf"),
    (dict(tool_choice={"type": "any"}), "tool_choice"),
    (dict(messages=[*ASK, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "x"}]}],
        tools=[WEATHER]), "toolu_2"),
])
def test_tool_refusals_are_anthropic_400s(sclaude, kw, says):
    with pytest.raises(anthropic.BadRequestError) as e:
        create(sclaude, **{"messages": ASK, "max_tokens": 10, **kw})
    assert e.value.status_code == 400 and says in e.value.body["error"]["message"]
    assert_error(e.value.body, "invalid_request_error")


SIX = [f"toolu_{n}" for n in "abcdef"]
SIX_USES = {"role": "assistant", "content": [{"type": "text", "text": "Checking six cities."}] + [
    {"type": "tool_use", "id": i, "name": "get_weather", "input": {"city": "Paris"}} for i in SIX]}


@pytest.mark.parametrize("next_turn, missing", [
    ([{"type": "tool_result", "tool_use_id": "toolu_a", "content": "18 C"}, {"type": "text", "text": "And?"}],
     SIX[1:]),
    ("What about Rome instead?", SIX),
    ([{"type": "text", "text": "Never mind."}], SIX),
])
def test_tool_use_blocks_without_their_tool_results_in_the_next_turn_are_a_400(sclaude, next_turn, missing):
    """As at Anthropic: each tool_use block of an assistant turn has its tool_result block in the
    next (user) turn; a turn that answers only some, or none, is an invalid_request_error naming
    the ids left without one."""
    with pytest.raises(anthropic.BadRequestError) as e:
        create(sclaude, max_tokens=10, tools=[WEATHER],
               messages=[*ASK, SIX_USES, {"role": "user", "content": next_turn}])
    assert_error(e.value.body, "invalid_request_error")
    message = e.value.body["error"]["message"]
    assert (f"messages[1]: `tool_use` ids were found without `tool_result` blocks immediately after: "
            f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in the "
            "next message") in message


def test_tool_results_in_any_order_and_a_prefill_after_them_pass(sclaude, script):
    script.script(" sunny everywhere.")
    results = [{"type": "tool_result", "tool_use_id": i, "content": "18 C"} for i in reversed(SIX)]
    msg = create(sclaude, max_tokens=10, tools=[WEATHER],
                 messages=[*ASK, SIX_USES, {"role": "user", "content": results},
                           {"role": "assistant", "content": "It is"}])
    assert msg.content[0].text == " sunny everywhere." and msg.stop_reason == "end_turn"


def _messages(server, stream: bool, **body) -> tuple[list[dict], str]:
    """(content, stop_reason) of a Messages answer, from the whole message or from the events of
    its stream folded as a client folds them; either way validated against Anthropic's types."""
    r = httpx.post(f"{server.url}/messages", timeout=60, json={"model": "x", "stream": stream, **body})
    assert r.status_code == 200, r.text
    if not stream:
        assert_message(r.json())
        return r.json()["content"], r.json()["stop_reason"]
    events = assert_events(r.text)
    blocks: list[dict] = []
    for e in events:
        if e["type"] == "content_block_start":
            blocks.append({**e["content_block"], **({"partial": ""} if e["content_block"]["type"] == "tool_use" else {})})
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            blocks[-1]["text"] += e["delta"]["text"]
        elif e["type"] == "content_block_delta":
            blocks[-1]["partial"] += e["delta"]["partial_json"]
    for b in blocks:
        if b["type"] == "tool_use":
            b["input"] = json.loads(b.pop("partial"))    # a block sent is a whole call
    return blocks, events[-2]["delta"]["stop_reason"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_never_a_tool_use_block(scripted, script, stream):
    """A forced call whose input max_tokens cuts short is reported as cut (stop_reason
    max_tokens), never as a tool_use block with made-up input; text before a cut call is kept;
    streamed and not streamed alike. With room enough, the same call is a whole tool_use block."""
    named = {"type": "tool", "name": "get_weather"}
    script.script(forced({"city": "Paris of France", "unit": "celsius"}))
    assert _messages(scripted, stream, messages=ASK, tools=[WEATHER], tool_choice=named, max_tokens=4) == (
        [], "max_tokens")
    script.script("Let me look that up. " + call("get_weather", {"city": "Paris of France", "unit": "celsius"}))
    content, reason = _messages(scripted, stream, messages=ASK, tools=[WEATHER], max_tokens=14)
    assert (content, reason) == ([{"type": "text", "text": "Let me look that up. "}], "max_tokens")
    script.script(forced({"city": "Paris of France", "unit": "celsius"}))
    content, reason = _messages(scripted, stream, messages=ASK, tools=[WEATHER], tool_choice=named, max_tokens=100)
    assert reason == "tool_use" and [b["type"] for b in content] == ["tool_use"]
    assert content[0]["input"] == {"city": "Paris of France", "unit": "celsius"}
