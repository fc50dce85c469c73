"""Function tools through /v1/responses: calls as function_call items, streamed argument
events, the round trip through function_call_output, and max_tool_calls."""

from __future__ import annotations

import json

import httpx
import jsonschema
from support.responses_api import create, stream_raw
from support.scripted import call, forced
from support.spec import error_of

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


def _two_calls(srclient, script):
    script.script(call("get_weather", {"city": "Paris", "unit": "celsius"}) + "\n"
                  + call("get_time", {"timezone": "Europe/Paris"}))
    first, _ = create(srclient, input=ASK, tools=[WEATHER, TIME], tool_choice="required")
    assert [item.type for item in first.output] == ["function_call", "function_call"]
    return first, [item.call_id for item in first.output]


def _output(call_id: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "done"}


def test_function_calls_left_without_their_outputs_are_a_400(srclient, srserver, script):
    """As at OpenAI ("No tool output found for function call call_x."): continuing from a
    response that ended in calls without answering them, answering one of two, or sending a
    call and then a user message without its output."""
    first, (a, b) = _two_calls(srclient, script)
    fc_a, fc_b = (item.model_dump(exclude_none=True) for item in first.output)
    cases = [
        ({"previous_response_id": first.id, "input": "And tomorrow?"}, a, "input[0]"),
        ({"previous_response_id": first.id, "input": [_output(b)]}, a, "input"),
        ({"previous_response_id": first.id, "input": [_output(a), {"role": "user", "content": "Thanks"}]}, b,
         "input[1]"),
        ({"input": [{"role": "user", "content": ASK}, fc_a, fc_b, _output(a), {"role": "user", "content": "Go on"}],
          "store": False}, b, "input[4]"),
    ]
    for body, missing, param in cases:
        r = httpx.post(f"{srserver.url}/responses", timeout=60,
                       json={"model": "x", "tools": [WEATHER, TIME], "max_output_tokens": 16, **body})
        err = error_of(r, 400)
        assert err["message"].startswith(f"No tool output found for function call {missing}."), err
        assert err["type"] == "invalid_request_error" and err["param"] == param


def test_outputs_for_every_call_in_any_order_continue_the_response(srclient, script):
    first, (a, b) = _two_calls(srclient, script)
    script.script("Sunny, and it is noon.")
    final, _ = create(srclient, previous_response_id=first.id, input=[_output(b), _output(a)], tools=[WEATHER, TIME],
                      max_output_tokens=30)
    assert final.output_text == "Sunny, and it is noon."
    # calls the input ends with (nothing after them) are left as they are, as before
    script.script("Sunny.")
    last, _ = create(srclient, input=[{"role": "user", "content": ASK}, first.output[0].model_dump(exclude_none=True)],
                     tools=[WEATHER, TIME], max_output_tokens=30, store=False)
    assert last.output_text == "Sunny."


def test_a_call_cut_by_max_output_tokens_needs_no_output(srclient, script):
    """An incomplete function_call (max_output_tokens cut it) was never a call the client could
    run: the conversation goes on from it with a new message."""
    script.script(forced({"city": "Paris of France, " * 8, "unit": "celsius"}))
    cut, _ = create(srclient, input=ASK, tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
                    max_output_tokens=16)
    assert cut.status == "incomplete" and [(i.type, i.status) for i in cut.output] == [("function_call", "incomplete")]
    script.script("Paris is sunny.")
    final, _ = create(srclient, previous_response_id=cut.id, input="Just tell me in words.", tools=[WEATHER],
                      max_output_tokens=30)
    assert final.output_text == "Paris is sunny."
