"""End to end on the real SmolLM2 model: response_format JSON and tool calling."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from openai_spec import assert_valid, assert_valid_stream

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "role": {"enum": ["engineer", "artist", "farmer"]},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "skills"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                   "required": ["timezone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def raw_chat(client, **kw):
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", **kw)
    body = raw.http_response.json()
    assert_valid("CreateChatCompletionResponse", body)
    return raw.parse(), body


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_json_schema_output_always_validates(client, seed):
    resp, _ = raw_chat(client, messages=[{"role": "user", "content": "Invent a person and describe them."}],
                       temperature=1.0, seed=seed, max_tokens=300,
                       response_format={"type": "json_schema",
                                        "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)


@pytest.mark.parametrize("ask", ["List two fruits as JSON.", "Describe a cat.", "What is 2 + 2?"])
def test_json_object_output_is_a_json_object(client, ask):
    resp, _ = raw_chat(client, messages=[{"role": "user", "content": ask}],
                       temperature=0, max_tokens=300, response_format={"type": "json_object"})
    assert resp.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(resp.choices[0].message.content), dict)


def test_sdk_parse_helper_with_a_pydantic_model(client):
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str
        population: int

    resp = client.chat.completions.parse(model="gpt-4o", messages=[{"role": "user", "content": "Describe Paris."}],
                                         response_format=City, temperature=0, max_tokens=200)
    assert isinstance(resp.choices[0].message.parsed, City)


def test_json_schema_streamed(live):
    r = httpx.post(f"{live.url}/chat/completions", timeout=120, json={
        "model": "x", "stream": True, "temperature": 0, "max_tokens": 300,
        "messages": [{"role": "user", "content": "Invent a person."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    jsonschema.validate(json.loads(text), PERSON)


def _check_calls(message, allowed):
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        schema = next(t["function"]["parameters"] for t in allowed if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_named_tool_call_is_always_valid(client, seed):
    resp, body = raw_chat(client, messages=ASK, tools=[WEATHER, TIME], seed=seed, temperature=0.8,
                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert body["choices"][0]["message"]["content"] is None
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    _check_calls(choice.message, [WEATHER])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_tool_call_is_always_valid(client, seed):
    resp, _ = raw_chat(client, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", seed=seed,
                       temperature=0.8)
    assert resp.choices[0].finish_reason == "tool_calls"
    _check_calls(resp.choices[0].message, [WEATHER, TIME])


def test_a_call_cut_short_by_max_tokens_finishes_with_length(client, live):
    """Not "tool_calls": the client must know the answer is unfinished. The cut call is never
    returned as a call that looks whole."""
    kw = dict(messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=8)
    resp, body = raw_chat(client, **kw)
    choice = resp.choices[0]
    assert choice.finish_reason == "length" and resp.usage.completion_tokens == 8
    assert not choice.message.tool_calls
    r = httpx.post(f"{live.url}/chat/completions", json={"model": "x", "stream": True, **kw}, timeout=60)
    finishes = [c["finish_reason"] for e in assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
                for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]


def test_parallel_tool_calls_false_gives_exactly_one_call(client):
    for seed in (1, 2):
        resp, _ = raw_chat(client, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                           parallel_tool_calls=False, seed=seed, temperature=1.0)
        assert len(resp.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_auto_answers_in_text_or_valid_calls_never_broken_ones(client, seed):
    resp, _ = raw_chat(client, messages=ASK, tools=[WEATHER, TIME], seed=seed, temperature=1.0, max_tokens=120)
    choice = resp.choices[0]
    if choice.message.tool_calls:
        # "length" if a further call was cut short by max_tokens
        assert choice.finish_reason == "tool_calls" or resp.usage.completion_tokens == 120
        _check_calls(choice.message, [WEATHER, TIME])
    else:
        assert choice.finish_reason in ("stop", "length")
        assert isinstance(choice.message.content, str)


def test_full_round_trip(client):
    first, _ = raw_chat(client, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})},
    ]
    final, _ = raw_chat(client, messages=history, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=60)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content


def test_streamed_tool_calls_accumulate_with_the_sdk_helper(client):
    with client.chat.completions.stream(model="gpt-4o", messages=ASK, tools=[WEATHER, TIME],
                                        tool_choice="required", temperature=0) as s:
        argument_deltas = [e for e in s if e.type == "tool_calls.function.arguments.delta"]
        final = s.get_final_completion()
    assert len(argument_deltas) > 1          # the arguments arrived in several fragments
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message, [WEATHER, TIME])


def test_streamed_tool_call_chunks_conform(live):
    r = httpx.post(f"{live.url}/chat/completions", timeout=120, json={
        "model": "x", "stream": True, "temperature": 0, "messages": ASK, "tools": [WEATHER],
        "tool_choice": "required", "stream_options": {"include_usage": True}})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["id"] and calls[0]["function"]["name"] == "get_weather" and calls[0]["index"] == 0
    assert all("id" not in tc and "name" not in tc["function"] for tc in calls[1:])
    args = "".join(tc["function"]["arguments"] for tc in calls)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == ["tool_calls"]


def test_legacy_functions_answer_with_function_call(client):
    resp, body = raw_chat(client, messages=ASK, functions=[WEATHER["function"]],
                          function_call={"name": "get_weather"}, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(choice.message.function_call.arguments), WEATHER["function"]["parameters"])
    assert "tool_calls" not in body["choices"][0]["message"]


@pytest.mark.parametrize("kwargs, param", [
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "object", "properties": {"n": {"type": "number", "minimum": 0}}}}}),
     "response_format.json_schema.schema.properties.n.minimum"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": PERSON}}), "response_format.json_schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "object", "not": {"required": ["a"]}}}}), "response_format.json_schema.schema.not"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}}), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "x y"}}]), "tools[0].function.name"),
    (dict(tools=[WEATHER], response_format={"type": "json_object"}), "response_format"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"k": {"type": "string", "format": "email", "uniqueItems": True}}}}}],
        tool_choice="required"), "tools[0].function.parameters.properties.k.uniqueItems"),
])
def test_structured_output_errors(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=ASK, **kwargs)
    assert e.value.body["param"] == param, e.value.body
    assert_valid("ErrorResponse", e.value.response.json())
