"""Tool calls in generated text, split across tokens any which way; tool declarations."""

from __future__ import annotations

import json

import httpx
import pytest
from jsonschema import Draft202012Validator
from support.spec import error_of

from openai_ext.core.errors import InvalidRequestError
from openai_ext.hosts.request import GenerationSettings
from openai_ext.text import grammar, tools
from openai_ext.text.protocol import ChatCompletionRequest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"], "additionalProperties": False}}}
WEATHER_VALIDATOR = Draft202012Validator(WEATHER["function"]["parameters"])
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
])
def test_text_that_is_not_a_valid_call_is_content(bad):
    s = tools.ToolCallStream(toolset(), incremental=False)
    content, calls = summarize(run(s, "ok " + bad, [5, 20]))
    assert calls == [] and content == "ok " + bad and s.calls == []


def test_calls_of_a_function_whose_grammar_was_relaxed_are_held_and_validated():
    """Under a grammar calls stream as written, but not those of a function whose schema the
    grammar enforces only in part: they wait until complete, and one that fails is content."""
    ts = toolset()
    ts.by_name["get_weather"].exact = False
    s = tools.ToolCallStream(ts, incremental=True)
    assert s.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa') == []
    content, calls = summarize(s.feed('ris", "unit": "C"}}\n</tool_call>') + s.finish())
    assert content == "" and [c["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "C"}
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "K"}}\n</tool_call>'
    s = tools.ToolCallStream(ts, incremental=True)
    content, calls = summarize(run(s, bad, list(range(3, len(bad), 5))))
    assert calls == [] and content == bad
    # cut short by max_tokens: the arguments written so far, as a call whose JSON was never complete
    s = tools.ToolCallStream(ts, incremental=True)
    content, calls = summarize(run(s, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os', [20]))
    assert content == "" and calls[0]["arguments"] == '{"city": "Os' and s.cut == {0}
    # the other function's calls still stream as they are written
    s = tools.ToolCallStream(ts, incremental=True)
    assert s.feed('<tool_call>\n{"name": "get_time", "arguments": {')


def test_a_complete_call_whose_closing_marker_never_came_is_a_call():
    s = tools.ToolCallStream(toolset(), incremental=False)
    content, calls = summarize(run(s, 'ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', [5]))
    assert content == "ok " and [c["name"] for c in calls] == ["get_weather"] and s.cut == set()


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
     "tools[0].function.parameters.type"),
    (dict(tools=[WEATHER], functions=[WEATHER["function"]]), "functions"),
    (dict(parallel_tool_calls=True), "parallel_tool_calls"),                  # OpenAI: only with tools
    (dict(functions=[WEATHER["function"]], parallel_tool_calls=False), "parallel_tool_calls"),
    (dict(functions=[WEATHER["function"]], tool_choice="auto"), "tool_choice"),  # functions take function_call
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


def test_call_grammar_names_unsupported_parameter_keywords_of_a_strict_tool():
    bad = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "multipleOf": 2}}}}}
    ts = tools.parse(ChatCompletionRequest(messages=MSG, tools=[WEATHER, bad], tool_choice="required"))
    with pytest.raises(InvalidRequestError) as e:
        tools.call_grammar(ts)
    assert e.value.param == "tools[1].function.parameters.properties.n.multipleOf"
    # the same tool, not strict: enforced as far as the grammar can (multipleOf is left out, and
    # its calls are validated before they are sent)
    lenient = {"type": "function", "function": {**bad["function"], "strict": False}}
    ts = tools.parse(ChatCompletionRequest(messages=MSG, tools=[WEATHER, lenient], tool_choice="required"))
    assert "tool-call" in tools.call_grammar(ts)
    assert [t.exact for t in ts.tools] == [True, False]


def test_legacy_error_paths_name_functions():
    # legacy functions have no `strict`, so only a schema the grammar cannot read at all is refused
    bad = {"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integr"}}}}
    with pytest.raises(InvalidRequestError) as e:
        tools.parse(ChatCompletionRequest(messages=MSG, functions=[WEATHER["function"], bad], function_call="auto"))
    assert e.value.param == "functions[1].parameters.properties.n.type"


def test_without_parallel_calls_whatever_follows_the_first_call_is_dropped():
    second = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    for incremental in (False, True):
        s = tools.ToolCallStream(toolset(parallel_tool_calls=False), incremental=incremental)
        content, calls = summarize(run(s, CALL + "\n" + second + " and some text", [30, len(CALL) + 3]))
        assert [c["name"] for c in calls] == ["get_weather"] and content == "" and len(s.calls) == 1


def test_a_streamed_call_that_fails_its_schema_is_finished_not_dropped():
    """Under a grammar this cannot happen; if it did, the id and name are out already, so the
    call must be completed and the next call must get the next index."""
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Oslo"}}\n</tool_call>'
    good = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    s = tools.ToolCallStream(toolset(), incremental=True)
    content, calls = summarize(run(s, bad + "\n" + good, list(range(5, len(bad) + len(good), 7))))
    assert [c["name"] for c in calls] == ["get_weather", "get_time"] and content == ""
    assert json.loads(calls[0]["arguments"]) == {"town": "Oslo"}
    assert [c["id"] for c in calls] == [c["id"] for c in s.calls]


# --- schemas the converter would have misread ---------------------------------------------------

def prepared(schema):
    return grammar.prepare(schema, "s").schema


def test_a_nullable_enum_keeps_its_values():
    # OpenAI's strict nullable pattern: the converter alone would allow any string here
    assert prepared({"type": ["string", "null"], "enum": ["a", "b", None, 3]}) == {"enum": ["a", "b", None]}
    assert prepared({"type": ["string", "null"], "maxLength": 3}) == {
        "anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}


def test_required_names_without_a_property_are_written():
    assert prepared({"type": "object", "required": ["x"]}) == {"type": "object", "properties": {"x": {}},
                                                               "required": ["x"]}
    with pytest.raises(InvalidRequestError) as e:
        prepared({"type": "object", "required": ["x"], "additionalProperties": False})
    assert e.value.param == "s.required"


def test_array_bounds_hold_without_items_and_with_prefix_items():
    assert prepared({"type": "array", "minItems": 2})["x-array"] == {"prefix": [], "item": {}, "min": 2, "max": None}
    tup = prepared({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"},
                    "minItems": 2, "maxItems": 3})["x-array"]
    assert tup == {"prefix": [{"type": "integer"}], "item": {"type": "string"}, "min": 1, "max": 2}
    assert prepared({"type": "array", "prefixItems": [{"type": "integer"}], "items": False})["x-array"]["max"] == 0
    with pytest.raises(InvalidRequestError) as e:
        prepared({"type": "array", "items": [{"type": "integer"}]})
    assert e.value.param == "s.items"


def test_siblings_of_any_of_and_ref_are_merged_in():
    out = prepared({"type": "object", "properties": {"a": {"type": "string"}},
                    "anyOf": [{"required": ["a"]}, {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]})
    assert [sorted(b["properties"]) for b in out["anyOf"]] == [["a"], ["a", "b"]]
    assert [b["required"] for b in out["anyOf"]] == [["a"], ["b"]]
    out = prepared({"$defs": {"S": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/S", "maxLength": 2}}})
    assert out["properties"]["x"] == {"type": "string", "maxLength": 2}


@pytest.mark.parametrize("schema, param", [
    ({"$ref": "https://example.com/s.json"}, "s.$ref"),
    ({"properties": {"a": {"$ref": "#/$defs/Missing"}}}, "s.properties.a.$ref"),
    ({"type": "string", "pattern": "(?=a)b"}, "s.pattern"),
    ({"type": "string", "pattern": "\\bword"}, "s.pattern"),
    ({"type": "string", "pattern": "^2", "format": "date"}, "s.format"),
    ({"type": "integer", "multipleOf": 5}, "s.multipleOf"),
    ({"type": "string", "pattern": '["\\\\]'}, "s.pattern"),          # nothing left that is safe in JSON
    ({"type": "string", "pattern": "(a"}, "s.pattern"),
])
def test_unsupported_parts_are_named(schema, param):
    with pytest.raises(InvalidRequestError) as e:
        grammar.prepare(schema, "s")
    assert e.value.param == param, e.value.message


def test_functions_with_definitions_of_the_same_name_keep_them_apart():
    def fn(name, inner):
        return {"type": "function", "function": {"name": name, "parameters": {
            "$defs": {"Item": inner}, "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}},
            "required": ["item"], "additionalProperties": False}}}
    ts = tools.parse(ChatCompletionRequest(messages=MSG, tool_choice="required", tools=[
        fn("a", {"type": "integer"}), fn("b", {"type": "object", "properties": {"x": {"type": "boolean"}}})]))
    g = tools.call_grammar(ts)
    rules = dict(line.split(" ::= ", 1) for line in g.splitlines())
    assert rules["ref-fn0-Item"] == "j-integer" and rules["ref-fn1-Item"].startswith('"{"')


# --- the grammar on the real model ------------------------------------------------------------

GREEDY = GenerationSettings(max_new_tokens=60, temperature=0.0, seed=1)
PATTERNS = ["^\\d{5}$", "^[^@ ]{1,12}@x\\.com$", "^(?:ab|cd)+$", "^a$|^b\\.$", "[\\w.-]{2,8}", "^\\D\\W\\S$", "^[^\\d\\s]{3}$",
            "^x{2,4}(y|z)?$", "^\\\\\\\"q$", "^\\n\\t$", "^[^a-z]{1,6}$", "^.{1,10}$", "^é{1,3}ü?$", "^(?P<n>a)b{,2}$"]


def generate(host, prompt_text, settings):
    import threading

    from openai_ext.hosts.base import Prompt
    return list(host.generate(Prompt(prompt_text, host.tokenize(prompt_text)), settings, threading.Event()))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_give_json_strings_that_match(llama_host, pattern):
    import re

    g = grammar.schema_to_gbnf({"type": "string", "pattern": pattern}, where="p")
    assert llama_host.check_grammar(g)
    prompt = llama_host.chat_prompt([{"role": "user", "content": "Write something."}]).text
    finished = 0
    for seed in (1, 2, 3):
        pieces = generate(llama_host, prompt, GREEDY.replace(temperature=1.0, seed=seed, grammar=g))
        if pieces[-1].finish_reason == "length":
            continue
        finished += 1
        value = json.loads("".join(p.text for p in pieces))
        assert re.search(pattern, value), (pattern, value)
    assert finished


def test_host_refuses_a_grammar_llama_cpp_cannot_parse(llama_host):
    assert not llama_host.check_grammar('root ::= "\\q"')
    assert llama_host.check_grammar('root ::= "a"')


def test_a_trigger_that_ends_inside_a_token_does_not_crash(llama_host):
    """llama.cpp's own lazy grammar aborts the process when the token completing the trigger
    carries text its grammar rejects: here the model writes "<tool_call" and then the token "><"."""
    ts = tools.parse(ChatCompletionRequest(messages=MSG, tools=[WEATHER], parallel_tool_calls=False))
    prompt = "x<tool_call>< " * 6 + "x"
    free = "".join(p.text for p in generate(llama_host, prompt, GREEDY.replace(max_new_tokens=5)))
    assert free.startswith("<tool_call><")          # what the model writes unconstrained
    pieces = generate(llama_host, prompt, GREEDY.replace(
        max_new_tokens=120, grammar=tools.call_grammar(ts, lazy=True), grammar_triggers=(tools.CALL_OPEN,)))
    text = "".join(p.text for p in pieces)
    assert text.startswith("<tool_call>") and pieces[-1].finish_reason == "stop"
    stream = tools.ToolCallStream(ts, incremental=True)
    content, calls = summarize(run(stream, text, []))
    assert content == "" and [c["name"] for c in calls] == ["get_weather"]
    WEATHER_VALIDATOR.validate(json.loads(calls[0]["arguments"]))


def test_a_trigger_inside_a_word_replaces_the_rest_of_the_token(llama_host):
    prompt = llama_host.chat_prompt([{"role": "user", "content": "Hi!"}]).text
    assert generate(llama_host, prompt, GREEDY.replace(max_new_tokens=1))[0].text == "Hello"
    pieces = generate(llama_host, prompt, GREEDY.replace(logprobs=1, grammar='root ::= "p!"', grammar_triggers=("Hel",)))
    assert "".join(p.text for p in pieces) == "Help!" and pieces[0].text == "Hel"
    assert pieces[0].logprob.token == "Hel"       # the log-probability is that of the token put in


def test_a_grammar_with_no_token_left_ends_the_answer(llama_host):
    """The grammar allows only the end of text, which ban_eos_token bans: llama.cpp would throw."""
    prompt = llama_host.chat_prompt([{"role": "user", "content": "Hi!"}]).text
    for temperature in (0.0, 1.0):
        pieces = generate(llama_host, prompt, GREEDY.replace(temperature=temperature, grammar='root ::= "a"',
                                                             samplers={"ban_eos_token": True}))
        assert "".join(p.text for p in pieces) == "a" and pieces[-1].finish_reason == "stop"


def _deep(levels: int, key: str) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema} if key == "items" else {"anyOf": [schema, {"type": "null"}]}
    return schema


@pytest.mark.parametrize("where", ["response_format", "tool"])
@pytest.mark.parametrize("levels,key", [(150, "items"), (100, "anyOf")])
def test_a_schema_nested_too_deep_is_a_400_naming_the_limit(scripted, where, levels, key):
    from openai_ext.text.grammar.errors import MAX_SCHEMA_DEPTH

    body = {"model": "x", "messages": MSG, "max_tokens": 5}
    if where == "response_format":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "d", "schema": _deep(levels, key)}}
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": _deep(levels, key)}}}}]
        body["tool_choice"] = "required"
    r = httpx.post(f"{scripted.url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert str(MAX_SCHEMA_DEPTH) in r.json()["error"]["message"]


# shell-gpt's default tool: an "example" in a property
SHELL_GPT_TOOL = {"type": "function", "function": {"name": "execute_shell_command", "description": "Runs a command",
                  "parameters": {"type": "object", "properties": {"shell_command": {
                      "type": "string", "description": "Shell command to execute.", "example": "ls -la"}},
                      "required": ["shell_command"]}}}


def test_annotation_keywords_are_accepted_and_nullable_is_honoured(live):
    r = httpx.post(f"{live.url}/chat/completions", timeout=120, json={
        "model": "x", "messages": [{"role": "user", "content": "List the files."}], "max_tokens": 60,
        "temperature": 0, "tools": [SHELL_GPT_TOOL], "tool_choice": "required", "parallel_tool_calls": False})
    assert r.status_code == 200, r.text
    call = r.json()["choices"][0]["message"]["tool_calls"][0]
    assert isinstance(json.loads(call["function"]["arguments"])["shell_command"], str)
    nullable = {"type": "object", "properties": {"note": {"type": "string", "nullable": True, "x-order": 1,
                                                          "discriminator": {"propertyName": "kind"}}},
                "required": ["note"], "additionalProperties": False}
    g = grammar.schema_to_gbnf(nullable, where="s")
    assert "null" in g


def test_a_pydantic_discriminated_union_works_end_to_end(live):
    schema = {"$defs": {
        "Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "meows": {"type": "boolean"}},
                "required": ["kind", "meows"]},
        "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}, "barks": {"type": "boolean"}},
                "required": ["kind", "barks"]}},
        "type": "object", "properties": {"pet": {"discriminator": {"propertyName": "kind", "mapping": {
            "cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}, "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}},
        "required": ["pet"]}
    r = httpx.post(f"{live.url}/chat/completions", timeout=120, json={
        "model": "x", "messages": [{"role": "user", "content": "Describe a pet."}], "max_tokens": 60, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}}})
    assert r.status_code == 200, r.text
    Draft202012Validator(schema).validate(json.loads(r.json()["choices"][0]["message"]["content"]))


def test_a_non_strict_schema_is_enforced_as_far_as_the_grammar_can_and_a_strict_one_refused(live):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "multipleOf": 3}},
              "required": ["n"], "additionalProperties": False}
    body = {"model": "x", "messages": [{"role": "user", "content": "Pick a number."}], "max_tokens": 30,
            "temperature": 0}
    lenient = httpx.post(f"{live.url}/chat/completions", timeout=120, json={**body, "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
    assert lenient.status_code == 200, lenient.text
    n = json.loads(lenient.json()["choices"][0]["message"]["content"])["n"]
    assert isinstance(n, int) and n >= 3        # minimum is enforced, multipleOf left out
    strict = httpx.post(f"{live.url}/chat/completions", timeout=120, json={**body, "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}})
    assert strict.status_code == 400 and strict.json()["error"]["param"].endswith(".multipleOf")


@pytest.mark.parametrize("cut_at", ['\n</tool', '"C"}}', '{"city": "Par'])
def test_a_call_cut_by_max_tokens_is_the_same_call_streamed_or_not_and_never_content(cut_at):
    """max_tokens ends the text inside a second call: after its JSON (only the closing marker
    is cut), or inside its arguments. Streamed (calls sent as generated) and whole, the calls
    are the same, and no markup reaches the content: a call cut inside its arguments is the
    call with the arguments written so far, as OpenAI returns one cut by max_tokens."""
    full = CALL + "\n\n" + CALL
    text = full[:full.rindex(cut_at) + len(cut_at)]
    got = []
    for incremental in (True, False):
        s = tools.ToolCallStream(toolset(parallel_tool_calls=True), incremental=incremental)
        content, calls = summarize(run(s, text, [7, 40, len(CALL) + 5] if incremental else []))
        assert content == "", (incremental, content)
        assert len(s.calls) == len(calls) == 2 and [c["name"] for c in calls] == ["get_weather"] * 2
        assert s.cut == ({1} if cut_at == '{"city": "Par' else set())
        got.append([(c["name"], c["arguments"]) for c in calls])
    assert got[0] == got[1]
    if cut_at == '{"city": "Par':
        assert got[0][1][1] == '{"city": "Par'
    else:
        assert json.loads(got[0][1][1]) == {"city": "Paris {x}", "unit": "C"}


@pytest.mark.parametrize("incremental", [True, False])
def test_an_opening_marker_cut_by_max_tokens_never_becomes_content(incremental):
    s = tools.ToolCallStream(toolset(tool_choice="required"), incremental=incremental)
    content, calls = summarize(run(s, CALL + "\n\n<tool_c", [len(CALL) + 3]))
    assert content == "" and [c["name"] for c in calls] == ["get_weather"]
    # free text (tool_choice auto) that ends in the start of a marker: cut there too ...
    s = tools.ToolCallStream(toolset(), incremental=incremental)
    assert summarize(run(s, "Let me check.\n<tool_c", [5])) == ("Let me check.\n", [])
    # ... but a lone "<" is the answer's own
    s = tools.ToolCallStream(toolset(), incremental=incremental)
    assert summarize(run(s, "x <", [])) == ("x <", [])


@pytest.mark.parametrize("incremental", [True, False])
def test_a_named_call_starts_from_what_the_prompt_holds(incremental):
    ts = toolset(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    ts.prefill = tools.named_call_prefill(ts)
    assert ts.prefill == '<tool_call>\n{"name": "get_weather", "arguments": '
    s = tools.ToolCallStream(ts, incremental=incremental)
    events = run(s, '{"city": "Oslo"}}', [3, 9])
    content, calls = summarize(events)
    assert content == "" and calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Oslo"}
    assert isinstance(events[0], tools.CallDelta) and events[0].id     # the call opens first
    # nothing generated yet (max_tokens 0): the prefill alone is no content either
    s = tools.ToolCallStream(ts, incremental=incremental)
    assert summarize(s.finish())[0] == ""


def test_the_name_of_a_call_is_the_models_own_choice_among_several():
    assert tools.named_call_prefill(toolset(tool_choice="required")) == ""
    assert tools.named_call_prefill(toolset()) == ""


def test_a_hostile_pattern_on_a_calls_arguments_is_checked_in_bounded_time(caplog):
    """A lookahead keeps the pattern from the linear-time matcher, and its nested repetition would
    take a backtracking engine hours on this string: the check runs out of its time and the
    arguments count as not matching, instead of holding the server."""
    from openai_ext.text.tools.validation import CallValidator, is_valid

    validator = CallValidator({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(?=a)(a|aa)+$"}}})
    assert is_valid(validator, {"s": "aaaa"})
    assert not is_valid(validator, {"s": "aaa!"})              # quick either way
    assert not is_valid(validator, {"s": "a" * 60 + "!"})
    assert "ran out of time" in caplog.text


@pytest.mark.parametrize("choice, is_call", [("required", True), ("auto", False)])
def test_a_call_failing_what_its_grammar_could_not_enforce(choice, is_call):
    """Required: the client asked for a call, so it is returned as written (as OpenAI returns a
    non-strict function's call). Auto: text that is not a valid call is content."""
    fn = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"t": {"type": "string", "pattern": "^(?!x)"}}, "required": ["t"]}}}
    ts = tools.parse(ChatCompletionRequest(messages=MSG, tools=[fn, TIME], tool_choice=choice))
    s = tools.ToolCallStream(ts, incremental=False)
    content, calls = summarize(run(s, '<tool_call>\n{"name": "tag", "arguments": {"t": "xyz"}}\n</tool_call>', []))
    assert bool(calls) is is_call and (content == "") is is_call


def _calls(*ids: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "get_time", "arguments": "{}"}} for i in ids]}


SIX = [f"call_{n}" for n in "abcdef"]


@pytest.mark.parametrize("after", [
    [{"role": "tool", "tool_call_id": "call_a", "content": "noon"}, {"role": "user", "content": "And now?"}],
    [{"role": "tool", "tool_call_id": "call_a", "content": "noon"}],
    [],
])
def test_an_assistant_turn_whose_tool_calls_are_not_all_answered_is_a_400_naming_them(scripted, after):
    """Six calls, and a tool message for the first only (then a user turn, or nothing): OpenAI
    answers 400, naming the tool_call_ids without a tool message; the model is never run on a
    history it would misread."""
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60, json={
        "model": "x", "max_tokens": 5, "tools": [TIME],
        "messages": [{"role": "user", "content": "What time is it in six cities?"}, _calls(*SIX), *after]})
    err = error_of(r, 400)
    assert err["type"] == "invalid_request_error"
    missing = SIX[1:] if after else SIX
    assert f"did not have response messages: {', '.join(missing)}" in err["message"]
    assert "messages[1]" in err["message"] and "'tool'" in err["message"]   # which turn, and what to send
    assert err["param"] == (f"messages[{1 + len(after)}].role" if len(after) == 2 else "messages[1].tool_calls")


def test_tool_calls_answered_in_any_order_pass(scripted, script):
    script.script("Noon everywhere.")
    answers = [{"role": "tool", "tool_call_id": i, "content": "noon"} for i in reversed(SIX)]
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60, json={
        "model": "x", "max_tokens": 20, "tools": [TIME],
        "messages": [{"role": "user", "content": "Time?"}, _calls(*SIX), *answers,
                     {"role": "user", "content": "Thanks"}, _calls("call_g"),
                     {"role": "tool", "tool_call_id": "call_g", "content": "noon"}]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Noon everywhere."
