"""Function tools through /v1/responses: calls as function_call items, streamed argument
events, the round trip through function_call_output, and max_tool_calls."""

from __future__ import annotations

import json

import jsonschema
from support.responses_api import create, stream_raw
from support.scripted import forced

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"type": "function", "name": "get_time", "description": "Current time in a timezone", "strict": False,
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
                       "required": ["timezone"], "additionalProperties": False}}
ASK = "What is the weather in Paris right now?"


def test_a_forced_call_is_a_valid_function_call_item(rclient):
    resp, body = create(rclient, input=ASK, tools=[WEATHER, TIME], tool_choice={"type": "function", "name": "get_weather"})
    assert resp.status == "completed"
    [call] = resp.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert body["tools"][0] == WEATHER and body["tools"][1]["strict"] is False
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_the_function_call_round_trip(srclient, script):
    """function_call -> function_call_output -> an answer, continued with previous_response_id."""
    script.script(forced({"city": "Paris", "unit": "celsius"}))
    first, _ = create(srclient, input=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    [call] = first.output
    output = {"type": "function_call_output", "call_id": call.call_id,
              "output": json.dumps({"temperature": 18, "sky": "sunny"})}
    final, body = create(srclient, previous_response_id=first.id, input=[output], tools=[WEATHER],
                         tool_choice="none", max_output_tokens=60)
    assert [item.type for item in final.output] == ["message"] and final.output_text.strip()
    assert body["previous_response_id"] == first.id
    # the same turn sent statelessly: the call and its output as input items, store off
    again, _ = create(srclient, input=[{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), output],
                      tools=[WEATHER], tool_choice="none", max_output_tokens=60, store=False)
    assert again.output_text == final.output_text
    assert again.usage.input_tokens == final.usage.input_tokens


def test_a_streamed_call_sends_argument_events(rserver):
    events = stream_raw(rserver, {"input": ASK, "tools": [WEATHER], "tool_choice": "required",
                                  "parallel_tool_calls": False})
    types = [e["type"] for e in events]
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "function_call" and added["item"]["status"] == "in_progress"
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert "".join(deltas) == done["arguments"] and done["name"] == "get_weather"
    jsonschema.validate(json.loads(done["arguments"]), WEATHER["parameters"])
    assert types.index("response.function_call_arguments.done") < types.index("response.output_item.done")
    final = events[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["output"][0]["arguments"] == done["arguments"]
    assert "response.output_text.delta" not in types


def test_max_tool_calls_limits_the_calls(rclient):
    resp, _ = create(rclient, input="Weather in Paris and the time in Tokyo?", tools=[WEATHER, TIME],
                     tool_choice="required", max_tool_calls=1, max_output_tokens=200)
    assert len([item for item in resp.output if item.type == "function_call"]) == 1
    none, _ = create(rclient, input=ASK, tools=[WEATHER], max_tool_calls=0, max_output_tokens=30)
    assert all(item.type == "message" for item in none.output)
