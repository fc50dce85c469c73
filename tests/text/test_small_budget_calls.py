"""A forced call fits a small budget, as at OpenAI: with one function forced (a named tool_choice,
or required with one tool), the server writes the call up to its arguments, so max_tokens is
spent on the arguments alone (LangChain's bind_tools(..., tool_choice="get_weather") with
max_tokens=16 needs a call back). Chat (streamed and whole), Responses and Messages."""

from __future__ import annotations

import json

import httpx
from jsonschema import Draft202012Validator
from support.anthropic_types import anthropic_client, assert_events, assert_message
from support.servers import openai_client
from support.spec import assert_valid, assert_valid_stream

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
VALID = Draft202012Validator(WEATHER["function"]["parameters"])


def test_a_named_call_fits_16_tokens_in_chat(live):
    client = openai_client(live)
    raw = client.chat.completions.with_raw_response.create(model="x", messages=ASK, tools=[WEATHER],
                                                           tool_choice=NAMED, max_tokens=16, temperature=0)
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    reply = raw.parse()
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and VALID.is_valid(json.loads(call.function.arguments))
    assert reply.usage.completion_tokens <= 16
    # streamed: the same call
    r = httpx.post(f"{live.url}/chat/completions", timeout=60, json={
        "model": "x", "messages": ASK, "tools": [WEATHER], "tool_choice": NAMED, "max_tokens": 16,
        "temperature": 0, "stream": True})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    deltas = [d for c in chunks for ch in c["choices"] for d in ch["delta"].get("tool_calls") or []]
    assert deltas[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"]["arguments"] for d in deltas) == call.function.arguments
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["tool_calls"]
    assert not any(ch["delta"].get("content") for c in chunks for ch in c["choices"])


def test_a_named_call_fits_16_tokens_in_responses(live):
    client = openai_client(live)
    tool = {"type": "function", **WEATHER["function"]}
    raw = client.responses.with_raw_response.create(model="x", input="What is the weather in Paris?", store=False,
                                                    tools=[tool], tool_choice={"type": "function", "name": "get_weather"},
                                                    max_output_tokens=16, temperature=0)
    assert_valid("Response", raw.http_response.json())
    response = raw.parse()
    assert response.status == "completed" and [item.type for item in response.output] == ["function_call"]
    assert VALID.is_valid(json.loads(response.output[0].arguments))


def test_a_named_tool_fits_16_tokens_in_messages(live):
    claude = anthropic_client(live)
    tool = {"name": "get_weather", "description": "The current weather in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    body = {"model": "x", "max_tokens": 16, "messages": ASK, "tools": [tool], "temperature": 0,
            "tool_choice": {"type": "tool", "name": "get_weather"}}
    raw = claude.messages.with_raw_response.create(**{k: v for k, v in body.items() if k != "temperature"},
                                                   extra_body={"temperature": 0})
    assert_message(raw.http_response.json())
    msg = raw.parse()
    assert msg.stop_reason == "tool_use" and [b.type for b in msg.content] == ["tool_use"]
    assert VALID.is_valid(msg.content[0].input)
    r = httpx.post(f"{live.url.removesuffix('/v1')}/v1/messages", timeout=60, json={**body, "stream": True},
                   headers={"anthropic-version": "2023-06-01"})
    events = assert_events(r.text)
    deltas = "".join(e["delta"].get("partial_json", "") for e in events if e.get("type") == "content_block_delta")
    assert json.loads(deltas) == msg.content[0].input
    assert [e["delta"]["stop_reason"] for e in events if e.get("type") == "message_delta"] == ["tool_use"]


CUT = {"city": "Paris of France"}


def test_a_forced_call_cut_by_max_tokens_is_reported_cut_in_chat(scripted, script):
    """Chat: finish_reason length and the arguments written so far, streamed or not; never
    finish_reason tool_calls, never made-up arguments."""
    from support.scripted import forced

    body = {"model": "x", "messages": ASK, "tools": [WEATHER], "tool_choice": NAMED, "max_tokens": 4}
    script.script(forced(CUT))
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60, json=body)
    assert_valid("CreateChatCompletionResponse", r.json())
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    [call] = choice["message"]["tool_calls"]
    whole = json.dumps(CUT)
    written = call["function"]["arguments"]
    assert written and whole.startswith(written) and written != whole
    script.script(forced(CUT))
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60, json={**body, "stream": True})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls") or []) == written
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_a_forced_call_cut_by_max_output_tokens_is_an_incomplete_item_in_responses(scripted, script):
    """Responses: the response is incomplete (max_output_tokens) and so is its function_call item,
    holding the arguments written so far; streamed, the item is done as incomplete and the stream
    ends with response.incomplete."""
    from support.responses_api import parse_events
    from support.scripted import forced

    tool = {"type": "function", **WEATHER["function"]}
    body = {"model": "x", "input": "What is the weather in Paris?", "tools": [tool], "store": False,
            "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 16}
    long = {"city": "Paris of France, " * 6}
    script.script(forced(long))
    r = httpx.post(f"{scripted.url}/responses", timeout=60, json=body)
    assert_valid("Response", r.json())
    resp = r.json()
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    [item] = resp["output"]
    assert item["type"] == "function_call" and item["status"] == "incomplete"
    assert json.dumps(long).startswith(item["arguments"]) and item["arguments"] not in ("", "{}")
    script.script(forced(long))
    events = parse_events(httpx.post(f"{scripted.url}/responses", timeout=60, json={**body, "stream": True}).text)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["type"], i["status"], i["arguments"]) for i in done] == [("function_call", "incomplete",
                                                                         item["arguments"])]
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
