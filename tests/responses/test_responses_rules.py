"""The parameter rules of /v1/responses and the mapping onto chat, without a model."""

from __future__ import annotations

import pytest
from support import ROOT

from openai_ext.core.errors import ContextLengthExceeded, InvalidRequestError
from openai_ext.responses import answers, convert, items, rules, tools
from openai_ext.responses.protocol import CreateResponse
from openai_ext.text import generation
from openai_ext.text.grammar.errors import check_schema


def test_every_parameter_has_a_rule_and_the_readme_shows_them():
    names = {r.name for r in rules.RULES}
    for field in CreateResponse.model_fields:
        assert field in names or any(n.startswith(field + ".") for n in names), field
    readme = (ROOT / "README.md").read_text()
    assert rules.markdown_table() in readme, "README's Responses table is stale: paste rules.markdown_table()"


def test_items_become_chat_turns():
    parsed = items.parse([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
        {"type": "reasoning", "summary": []},
    ])
    answers.check_call_outputs([], parsed)
    turns = convert.chat_messages("Be brief.", parsed)
    assert turns == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
    ]
    assert parsed[0]["content"] == [{"type": "input_text", "text": "Weather?"}]
    assert parsed[1]["content"][0] == {"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}


def test_chat_errors_are_renamed_to_what_the_client_sent():
    err = convert.translate(InvalidRequestError("bad", param="tools[2].function.parameters.properties"))
    assert err.param == "tools[2].parameters.properties"
    err = convert.translate(InvalidRequestError("remove {param}.", param="response_format.json_schema.schema"))
    assert err.param == "text.format.schema" and err.message == "remove text.format.schema."
    # the remedy is a phrase each family says its own way, picked by its key
    err = convert.translate(ContextLengthExceeded("12 tokens are taken by the {param} alone. Shorten the {param}, "
                                                  "or {remedy}.", words=generation.TRUNCATE))
    assert err.param == "input" and err.code == "context_length_exceeded"
    assert err.message == ('12 tokens are taken by the input alone. Shorten the input, or send truncation: "auto" '
                           'to drop the oldest input items.')


def test_tool_choice_and_format_shapes():
    assert tools.chat_tool_choice({"type": "function", "name": "f"}) == {"type": "function", "function": {"name": "f"}}
    assert tools.chat_tool_choice({"type": "allowed_tools", "mode": "required",
                                     "tools": [{"type": "function", "name": "f"}]}) == {
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "f"}}]}}
    assert convert.response_format({"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}) == {
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": True}}
    assert convert.response_format({"type": "text"}) == {"type": "text"}


def test_pagination():
    listed = [{"id": f"i{k}"} for k in range(5)]
    page = items.page(listed, after=None, limit=2, order="desc")
    assert [i["id"] for i in page["data"]] == ["i4", "i3"] and page["has_more"] and page["last_id"] == "i3"
    page = items.page(listed, after="i3", limit=5, order="desc")
    assert [i["id"] for i in page["data"]] == ["i2", "i1", "i0"] and not page["has_more"]
    page = items.page(listed, after="i1", limit=2, order="asc")
    assert [i["id"] for i in page["data"]] == ["i2", "i3"] and page["has_more"]


def test_truncation_auto_finds_the_cut_in_few_tries(monkeypatch):
    """Dropping one item per try would tokenize a long history once per item (quadratic work
    for one request); the cut is found by bisection, and it is the longest suffix that fits."""
    history = []
    for i in range(3000):
        history += [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"q{i}"}]},
                    {"type": "function_call_output", "call_id": f"c{i}", "output": "x"}]
    new = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "last"}]}]
    fits, calls = 41, []

    def prepare(text, req, *, truncate):
        calls.append(len(req.messages))
        if len(req.messages) > fits:
            raise ContextLengthExceeded("This model's maximum context length is 10 tokens, and 12 tokens are taken by "
                                        "the {param} alone. Shorten the {param}.")
        return req.messages

    monkeypatch.setattr(convert.chat, "prepare", prepare)
    body = CreateResponse(model="m", input="x", truncation="auto")
    got = convert.prepare(None, body, history, new)
    assert len(got) == fits and got[-1].content == "last" and got[0].role == "user"   # 20 turns and the new one
    assert len(calls) <= 16, calls
    # disabled: one try, and the error names input
    body = CreateResponse(model="m", input="x", truncation="disabled")
    calls.clear()
    try:
        convert.prepare(None, body, history, new)
    except InvalidRequestError as e:
        assert e.param == "input" and e.code == "context_length_exceeded" and len(calls) == 1
    else:
        raise AssertionError("a prompt that does not fit was accepted")


def _fn(name: str) -> dict:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}


def test_a_namespace_is_flattened_and_its_names_map_back():
    """Own names where they are unique; namespace__name for a namespaced function whose name is
    taken; the way back from either, and history shown under the same names."""
    built = tools.build([_fn("read"), {"type": "namespace", "name": "fs", "description": "Files.",
                                       "tools": [_fn("read"), _fn("write")]}])
    assert [t["function"]["name"] for t in built.chat] == ["read", "fs__read", "write"]
    assert built.paths == ["tools[0]", "tools[1].tools[0]", "tools[1].tools[1]"]
    assert built.chat[2]["function"]["description"] == "Files."
    assert [built.call(n) for n in ("read", "fs__read", "write")] == [(None, "read"), ("fs", "read"), ("fs", "write")]
    calls = items.parse([{"type": "function_call", "call_id": "c1", "name": "read", "namespace": "fs", "arguments": "{}"},
                         {"type": "function_call_output", "call_id": "c1", "namespace": "fs", "output": "x"}])
    assert calls[0]["namespace"] == "fs" and calls[1]["namespace"] == "fs"
    [turn, _] = convert.chat_messages(None, calls, built)
    assert turn["tool_calls"][0]["function"]["name"] == "fs__read"
    # a name over chat's 64 characters is cut, with a digest that keeps two such names apart
    long = tools.build([{"type": "namespace", "name": "n" * 60, "description": "", "tools": [_fn("a"), _fn("b")]},
                        _fn("a"), _fn("b")])
    shown = [t["function"]["name"] for t in long.chat[:2]]
    assert all(len(s) <= 64 for s in shown) and shown[0] != shown[1]
    assert long.call(shown[1]) == ("n" * 60, "b")


def test_a_chat_error_on_a_namespaced_function_names_it_where_it_was_sent():
    paths = ["tools[0]", "tools[1].tools[0]"]
    with pytest.raises(InvalidRequestError) as e:
        check_schema({"type": "object", "properties": 5}, "tools[1].function.parameters")
    err = convert.translate(e.value, paths)
    assert err.param == "tools[1].tools[0].parameters.properties"
    assert err.message.startswith("tools[1].tools[0].parameters.properties is not a valid JSON Schema: 5 is not")


def test_an_mcp_call_sent_back_with_its_error_as_a_string_is_shown_to_the_model():
    """OpenAI's McpToolCall.error is a string: a client's history may carry one (this server writes
    an object); the model reads it either way, in the prompt and in a compaction's transcript."""
    from openai_ext.responses import compaction
    parsed = items.parse([
        {"type": "mcp_call", "server_label": "docs", "name": "lookup", "arguments": "{}", "status": "failed",
         "error": "the server timed out"},
        {"type": "mcp_call", "server_label": "docs", "name": "lookup", "arguments": "{}", "status": "failed",
         "error": {"type": "http_error", "code": 429, "message": "too many"}}])
    turns = convert.chat_messages(None, parsed)
    assert [t["content"] for t in turns if t["role"] == "tool"] == ["Error: the server timed out", "Error: too many"]
    assert "which returned: Error: the server timed out" in compaction.line(parsed[0])
