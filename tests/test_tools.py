"""Tool calls in generated text, split across tokens any which way; tool declarations."""

from __future__ import annotations

import json

import pytest

from openai_ext import tools
from openai_ext.errors import InvalidRequestError
from openai_ext.protocol import ChatCompletionRequest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
MSG = [{"role": "user", "content": "hi"}]


def toolset(**kw):
    return tools.parse(ChatCompletionRequest(messages=MSG, tools=[WEATHER, TIME], **kw))


def run(stream, text, cuts):
    events = []
    last = 0
    for c in [*cuts, len(text)]:
        events += stream.feed(text[last:c])
        last = c
    events += stream.finish()
    return events


def summarize(events):
    content = "".join(e.text for e in events if isinstance(e, tools.Content))
    calls = {}
    for e in events:
        if isinstance(e, tools.CallDelta):
            entry = calls.setdefault(e.index, {"id": None, "name": None, "arguments": ""})
            if e.id:
                assert entry["id"] is None, "id sent twice"
                entry["id"], entry["name"] = e.id, e.name
            entry["arguments"] += e.arguments
    return content, [calls[i] for i in sorted(calls)]


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris {x}", "unit": "C"}}\n</tool_call>'


@pytest.mark.parametrize("incremental", [True, False])
def test_a_call_split_at_every_position(incremental):
    text = "Let me check." + CALL
    for cut in range(1, len(text)):
        s = tools.ToolCallStream(toolset(), incremental=incremental)
        content, calls = summarize(run(s, text, [cut]))
        assert content == "Let me check."
        assert [c["name"] for c in calls] == ["get_weather"]
        assert json.loads(calls[0]["arguments"]) == {"city": "Paris {x}", "unit": "C"}
        assert calls[0]["id"].startswith("call_")
        assert s.calls[0]["function"]["arguments"] == calls[0]["arguments"]


def test_character_by_character_parallel_calls():
    text = CALL + "\n" + '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    s = tools.ToolCallStream(toolset(), incremental=True)
    content, calls = summarize(run(s, text, list(range(1, len(text)))))
    assert content == ""          # the newline between calls is not content
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[1]["arguments"]) == {}


def test_arguments_stream_before_the_call_closes():
    s = tools.ToolCallStream(toolset(), incremental=True)
    events = s.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    starts = [e for e in events if isinstance(e, tools.CallDelta) and e.name]
    frags = "".join(e.arguments for e in events if isinstance(e, tools.CallDelta))
    assert starts and starts[0].name == "get_weather" and frags == '{"city": "Pa'


@pytest.mark.parametrize("bad", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',   # schema fails
    '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>',                # unknown function
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>',        # broken JSON
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',                 # never closed
])
def test_text_that_is_not_a_valid_call_is_content(bad):
    s = tools.ToolCallStream(toolset(), incremental=False)
    content, calls = summarize(run(s, "ok " + bad, [5, 20]))
    assert calls == [] and content == "ok " + bad and s.calls == []


def test_plain_text_passes_through_and_partial_marker_is_released():
    s = tools.ToolCallStream(toolset(), incremental=False)
    content, calls = summarize(run(s, "a <tool or <b>", [3, 7, 9]))
    assert content == "a <tool or <b>" and calls == []


def test_named_choice_allows_only_that_function():
    ts = toolset(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert (ts.choice, ts.allowed, ts.parallel) == ("required", ["get_time"], False)
    s = tools.ToolCallStream(ts, incremental=False)
    content, calls = summarize(run(s, CALL, []))
    assert calls == []   # get_weather is declared but not allowed now


def test_legacy_functions_map_onto_tools():
    req = ChatCompletionRequest(messages=MSG, functions=[WEATHER["function"]], function_call={"name": "get_weather"})
    ts = tools.parse(req)
    assert ts.legacy and ts.allowed == ["get_weather"] and ts.choice == "required" and not ts.parallel


@pytest.mark.parametrize("kw, param", [
    (dict(tools=[{"type": "retrieval"}]), "tools[0]"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools[0].function.name"),
    (dict(tools=[WEATHER, WEATHER]), "tools[1]"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]),
     "tools[0].function.parameters"),
    (dict(tools=[WEATHER], functions=[WEATHER["function"]]), "functions"),
])
def test_bad_declarations(kw, param):
    with pytest.raises(InvalidRequestError) as e:
        tools.parse(ChatCompletionRequest(messages=MSG, **kw))
    assert e.value.param == param


def test_fallback_rendering_keeps_every_turn():
    ts = toolset()
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    msgs, tools_arg = tools.for_template(history, ts, native=False)
    assert tools_arg is None
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.")
    assert "get_weather" in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    assert msgs[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": '
                                                       '{"city": "Paris"}}\n</tool_call>'}
    assert msgs[3] == {"role": "user", "content": "<tool_response>\n18 C, sunny\n</tool_response>"}


def test_native_rendering_passes_tools_and_object_arguments():
    ts = toolset()
    history = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}]
    msgs, tools_arg = tools.for_template(history, ts, native=True)
    assert [t["function"]["name"] for t in tools_arg] == ["get_weather", "get_time"]
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == {}


def test_call_grammar_names_unsupported_parameter_keywords():
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}}
    ts = tools.parse(ChatCompletionRequest(messages=MSG, tools=[WEATHER, bad], tool_choice="required"))
    with pytest.raises(InvalidRequestError) as e:
        tools.call_grammar(ts)
    assert e.value.param == "tools[1].function.parameters.properties.n.minimum"
