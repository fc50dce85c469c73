"""End to end on the real SmolLM2 model: response_format JSON and tool calling."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from support.servers import openai_client
from support.spec import assert_valid, assert_valid_stream

pytestmark = pytest.mark.slow

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
    """Not "tool_calls": the client must know the answer is unfinished. The one function forced,
    its name is written by the server, so the cut falls inside the arguments: the call comes with
    what was written, as OpenAI returns a call cut by max_tokens, never as one that looks whole."""
    kw = dict(messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=4)
    resp, body = raw_chat(client, **kw)
    choice = resp.choices[0]
    assert choice.finish_reason == "length" and resp.usage.completion_tokens == 4
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)
    assert choice.message.content is None
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
    assert choice.message.content is None    # as at OpenAI: the first chunk's content is null
    _check_calls(choice.message, [WEATHER, TIME])


def test_streamed_tool_call_chunks_conform(live):
    r = httpx.post(f"{live.url}/chat/completions", timeout=120, json={
        "model": "x", "stream": True, "temperature": 0, "messages": ASK, "tools": [WEATHER],
        "tool_choice": "required", "stream_options": {"include_usage": True}})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    first = chunks[0]["choices"][0]["delta"]
    assert first["role"] == "assistant" and first["content"] is None and first["tool_calls"][0]["id"]
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


# strict schemas: a keyword the grammar cannot enforce is a 400 naming it (non-strict ones are
# enforced as far as the grammar can: see test_tools.py)
@pytest.mark.parametrize("kwargs, param", [
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "strict": True, "schema": {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}}),
     "response_format.json_schema.schema.properties.n.multipleOf"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": PERSON}}), "response_format.json_schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "strict": True, "schema": {"type": "object", "not": {"required": ["a"]}}}}),
     "response_format.json_schema.schema.not"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_time"}}), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "x y"}}]), "tools[0].function.name"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"k": {"type": "string", "format": "email", "uniqueItems": True}}}}}],
        tool_choice="required"), "tools[0].function.parameters.properties.k.uniqueItems"),
    (dict(tools=[WEATHER], functions=[WEATHER["function"]]), "functions"),
    (dict(tools=[WEATHER, WEATHER]), "tools[1]"),                                      # duplicate names
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}]), "tools[0].function.parameters.properties.a.type"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}}}], tool_choice="auto"),
     "tools[0].function.parameters.properties.a.$ref"),                                  # external $ref
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "n", "strict": True, "schema": {
        "type": "object", "properties": {"w": {"type": "string", "pattern": "^(?!x)\\w+$"}}}}}),
     "response_format.json_schema.schema.properties.w.pattern"),                        # lookahead
    (dict(parallel_tool_calls=False), "parallel_tool_calls"),                           # OpenAI: only with tools
    (dict(functions=[WEATHER["function"]], tool_choice="auto"), "tool_choice"),
    (dict(functions=[{"name": "f", "strict": True, "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "maximum": 3, "multipleOf": 3}}}}], function_call={"name": "f"}),
     "functions[0].parameters.properties.n.multipleOf"),
])
def test_structured_output_errors(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=ASK, **kwargs)
    assert e.value.body["param"] == param, e.value.body
    assert_valid("ErrorResponse", e.value.response.json())


def test_function_role_without_a_name_is_refused(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=ASK + [{"role": "function", "content": "18 C"}])
    assert e.value.body["param"] == "messages[1].name"


# --- schemas llama.cpp's converter alone would get wrong ---------------------------------------

def test_named_call_with_nested_pydantic_models(client):
    """The parameters refer to a nested model through $defs/$ref, resolved within this tool."""
    from typing import Optional

    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: str = Field(max_length=30)
        zip: str = Field(pattern=r"^\d{5}$")

    class Person(BaseModel):
        name: str = Field(max_length=30)
        home: Address
        work: Optional[Address]

    tool = openai.pydantic_function_tool(Person)
    assert "$defs" in tool["function"]["parameters"]
    for seed in (1, 2):
        resp = client.chat.completions.parse(
            model="gpt-4o", messages=[{"role": "user", "content": "Record Ann, who lives in Oslo."}], tools=[tool],
            tool_choice={"type": "function", "function": {"name": "Person"}}, seed=seed, temperature=0.7,
            max_tokens=300)
        call = resp.choices[0].message.tool_calls[0]
        assert resp.choices[0].finish_reason == "tool_calls"
        assert isinstance(call.function.parsed_arguments, Person)
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


NULLABLE = {"type": "object", "additionalProperties": False, "required": ["color", "size", "note"], "properties": {
    "color": {"type": ["string", "null"], "enum": ["red", "green", None]},   # OpenAI's strict nullable enum
    "size": {"type": ["integer", "null"]},
    "note": {"type": ["string", "null"], "maxLength": 12}}}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_nullable_enum_validates(client, seed):
    resp, _ = raw_chat(client, messages=[{"role": "user", "content": "Pick a color, a size and a note."}],
                       temperature=1.0, seed=seed, max_tokens=120,
                       response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": NULLABLE}})
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), NULLABLE)


CONTACT = {"type": "object", "additionalProperties": False, "required": ["zip", "email"], "properties": {
    "zip": {"type": "string", "pattern": "^\\d{5}$"},
    "email": {"type": "string", "pattern": "^[^@]+@x\\.com$"}}}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_patterns_give_valid_json_that_matches(client, seed):
    ask = "My zip is 12345 and my email is ann@x.com. Fill in the form."
    resp, _ = raw_chat(client, messages=[{"role": "user", "content": ask}],
                       temperature=0.8, seed=seed, max_tokens=200,
                       response_format={"type": "json_schema", "json_schema": {"name": "contact", "schema": CONTACT}})
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), CONTACT)   # pattern checks included


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_json_object_at_temperature_one(client, seed):
    resp, _ = raw_chat(client, messages=[{"role": "user", "content": "Describe a cat as JSON."}], temperature=1.0,
                       seed=seed, max_tokens=300, response_format={"type": "json_object"})
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(resp.choices[0].message.content), dict)
    else:  # cut by max_tokens: an unfinished object, never anything else
        assert resp.choices[0].message.content.lstrip().startswith("{")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_response_format_with_auto_tools_gives_a_call_or_the_json(client, seed):
    """What the Agents SDK sends for an agent with an output type and tools."""
    answer = {"type": "object", "additionalProperties": False, "required": ["summary"],
              "properties": {"summary": {"type": "string", "maxLength": 60}}}
    resp, body = raw_chat(client, messages=ASK, tools=[WEATHER], temperature=1.0, seed=seed, max_tokens=120,
                          response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": answer}})
    choice = resp.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls" and body["choices"][0]["message"]["content"] is None
        _check_calls(choice.message, [WEATHER])
    else:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), answer)


# --- auto mode, where the model really calls -----------------------------------------------------

AUTO = dict(messages=ASK, tools=[WEATHER, TIME], temperature=1.0, max_tokens=120)


@pytest.fixture(scope="module")
def calling_seed(live):
    """A seed with which the model, free to answer in text, calls a tool."""
    c = openai_client(live)
    for seed in range(1, 13):
        if c.chat.completions.create(model="x", seed=seed, **AUTO).choices[0].message.tool_calls:
            return seed
    pytest.fail("the model called no tool under tool_choice auto with any seed tried")


def test_auto_call_streamed_accumulates_with_the_sdk_helper(client, calling_seed):
    plain = client.chat.completions.create(model="x", seed=calling_seed, **AUTO).choices[0]
    with client.chat.completions.stream(model="gpt-4o", seed=calling_seed, **AUTO) as s:
        events = [e.type for e in s]
        final = s.get_final_completion()
    choice = final.choices[0]
    assert "tool_calls.function.arguments.done" in events
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check_calls(choice.message, [WEATHER, TIME])
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in plain.message.tool_calls]


def test_auto_round_trip_puts_the_tool_result_into_the_prompt(client, live, calling_seed):
    first = client.chat.completions.create(model="x", seed=calling_seed, **AUTO).choices[0].message
    results = [{"role": "tool", "tool_call_id": c.id, "content": f"RESULT-{i}: 18 C, sunny"}
               for i, c in enumerate(first.tool_calls)]
    history = ASK + [first.model_dump(exclude_none=True), *results]
    prompt = httpx.post(f"{live.url}/internal/chat-prompt", timeout=30,
                        json={"messages": history, "tools": [WEATHER, TIME]}).json()["prompt"]
    assert all(r["content"] in prompt for r in results)
    assert first.tool_calls[0].function.name in prompt
    final, _ = raw_chat(client, messages=history, tools=[WEATHER, TIME], temperature=0, max_tokens=60)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.choices[0].message.content or final.choices[0].message.tool_calls


def test_legacy_function_turns_round_trip(client, live):
    """An assistant function_call and a 'function' message become a call and its result."""
    history = ASK + [
        {"role": "assistant", "content": None,
         "function_call": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}},
        {"role": "function", "name": "get_weather", "content": "RESULT-7: 18 C, sunny"}]
    prompt = httpx.post(f"{live.url}/internal/chat-prompt", timeout=30,
                        json={"messages": history, "functions": [WEATHER["function"]]}).json()["prompt"]
    assert "RESULT-7: 18 C, sunny" in prompt and '"city": "Paris"' in prompt
    resp, _ = raw_chat(client, messages=history, functions=[WEATHER["function"]], function_call="none",
                       temperature=0, max_tokens=40)
    assert resp.choices[0].message.content and resp.choices[0].message.function_call is None


@pytest.mark.parametrize("max_tokens", [60, 45, 33])
def test_calls_cut_by_max_tokens_are_the_same_streamed_or_not_and_never_content(client, max_tokens):
    """tool_choice required with parallel calls lets the model write a second call until
    max_tokens cuts it: both ways give the same calls, and no markup reaches the content."""
    kw = dict(messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=max_tokens)
    whole, body = raw_chat(client, **kw)
    message = body["choices"][0]["message"]
    assert "tool_call" not in (message["content"] or "") and "</tool" not in (message["content"] or "")
    calls = {}
    reason = None
    for chunk in client.chat.completions.create(model="x", stream=True, **kw):
        choice = chunk.choices[0]
        assert "tool_call" not in (choice.delta.content or "")
        reason = choice.finish_reason or reason
        for d in choice.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"name": None, "arguments": ""})
            entry["name"] = d.function.name or entry["name"]
            entry["arguments"] += d.function.arguments or ""
    streamed = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
    assert streamed == [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert reason == whole.choices[0].finish_reason
