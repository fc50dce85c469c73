"""The translation of Messages requests into chat requests, the content blocks built from
generated text, and the stop reasons: pure logic, no server."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from support import ROOT

from openai_ext.core.errors import InvalidRequestError, from_validation_errors
from openai_ext.messages import render, translate
from openai_ext.messages.protocol import CountTokensRequest, MessagesRequest
from openai_ext.messages.stream import Blocks
from openai_ext.text import tools
from openai_ext.text.output import OutputParser

WEATHER = {"name": "get_weather", "description": "Weather",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def validated(model, body):
    """``body`` read as the route reads it: a refused one is the 400 the client gets (core.handlers)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation_errors(list(e.errors())) from None


def chat_of(**kw):
    return translate.to_chat(validated(MessagesRequest, {"model": "m", "max_tokens": 10, **kw}))


def test_a_conversation_with_tools_becomes_chat_turns():
    tr = chat_of(system=[{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}],
                 tools=[WEATHER], messages=[
                     {"role": "user", "content": "Weather in Paris and Rome?"},
                     {"role": "assistant", "content": [
                         {"type": "thinking", "thinking": "two calls", "signature": "sig"},
                         {"type": "text", "text": "Checking."},
                         {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
                         {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {"city": "Rome"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": "toolu_a", "content": "18C"},
                         {"type": "tool_result", "tool_use_id": "toolu_b", "is_error": True,
                          "content": [{"type": "text", "text": "offline"}]},
                         {"type": "text", "text": "Summarise."}]}])
    msgs = [m.model_dump(exclude_none=True) for m in tr.chat.messages]
    assert msgs[0] == {"role": "system", "content": "Rule one.\nRule two."}
    assert msgs[1] == {"role": "user", "content": "Weather in Paris and Rome?"}
    assert msgs[2]["content"] == "Checking." and [c["id"] for c in msgs[2]["tool_calls"]] == ["toolu_a", "toolu_b"]
    assert json.loads(msgs[2]["tool_calls"][1]["function"]["arguments"]) == {"city": "Rome"}
    assert msgs[3] == {"role": "tool", "tool_call_id": "toolu_a", "content": "18C"}
    assert msgs[4] == {"role": "tool", "tool_call_id": "toolu_b", "content": "Error: offline"}
    assert msgs[5] == {"role": "user", "content": "Summarise."}
    assert tr.chat.tools[0]["function"]["parameters"] == WEATHER["input_schema"] and tr.prefill == ""


@pytest.mark.parametrize("choice, chat_choice, parallel", [
    ({"type": "auto"}, "auto", None),
    ({"type": "any"}, "required", None),
    ({"type": "none"}, "none", None),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, None),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
])
def test_tool_choice_rules(choice, chat_choice, parallel):
    tr = chat_of(messages=[{"role": "user", "content": "x"}], tools=[WEATHER], tool_choice=choice)
    assert tr.chat.tool_choice == chat_choice and tr.chat.parallel_tool_calls is parallel
    ts = tools.parse(tr.chat)
    assert ts.parallel is (parallel is not False and choice["type"] != "tool")


def test_parameters_without_a_chat_counterpart():
    tr = chat_of(messages=[{"role": "user", "content": "x"}], temperature=0.3, top_p=0.5, top_k=7, stream=True,
                 metadata={"user_id": "u-9"}, stop_sequences=["a", "b", "c", "d", "e", "f"], min_p=0.1,
                 output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "low"},
                 thinking={"type": "disabled"}, service_tier="auto", cache_control={"type": "ephemeral"})
    chat = tr.chat
    assert (chat.temperature, chat.top_p, chat.stream, chat.user, chat.max_tokens) == (0.3, 0.5, True, "u-9", 10)
    assert chat.model_extra == {"top_k": 7, "min_p": 0.1,        # host samplers, checked by params.plan
                                "enable_thinking": False}    # the reasoning switch
    assert chat.stop == tr.stops == ["a", "b", "c", "d", "e", "f"]
    assert chat.response_format == {"type": "json_schema", "json_schema": {"name": "output",
                                                                          "schema": {"type": "object"}}}


def test_a_last_assistant_turn_is_a_prefill():
    tr = chat_of(messages=[{"role": "user", "content": "Q"}, {"role": "assistant", "content": "The answer is"}])
    assert tr.prefill == "The answer is" and [m.role for m in tr.chat.messages] == ["user"]


@pytest.mark.parametrize("kw, param", [
    (dict(messages=[{"role": "user", "content": "x"}], max_token=3), "max_token"),
    (dict(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]), "messages[0].content[0].type"),
    (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
     "messages[0].content[0].source.type"),
    (dict(messages=[{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]),
     "messages[0].content[0].type"),
    (dict(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]),
     "messages[0].content[0].tool_use_id"),
    (dict(messages=[{"role": "user", "content": "x"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]),
     "messages[1]"),
    (dict(messages=[{"role": "user", "content": "x"}], tools=[{"type": "code_execution_20250522",
                                                                "name": "code_execution"}]), "tools[0].type"),
    (dict(messages=[{"role": "user", "content": "x"}], tool_choice={"type": "tool"}), "tool_choice.name"),
    (dict(messages=[{"role": "user", "content": "x"}], thinking={"type": "enabled"}), "thinking.budget_tokens"),
])
def test_refusals_name_the_parameter(kw, param):
    with pytest.raises(InvalidRequestError) as e:
        chat_of(**kw)
    assert e.value.param == param and e.value.message


def test_count_tokens_requests_take_no_sampling_fields():
    req = CountTokensRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert translate.to_chat(req).chat.max_tokens is None
    with pytest.raises(InvalidRequestError):
        translate.to_chat(validated(CountTokensRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                         "max_tokens": 5}))


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris {x}"}}\n</tool_call>'


def toolset():
    return tools.parse(chat_of(messages=[{"role": "user", "content": "x"}], tools=[WEATHER]).chat)


@pytest.mark.parametrize("incremental", [True, False])
def test_blocks_from_text_split_at_every_position(incremental):
    text = "Let me check." + CALL
    for cut in range(1, len(text)):
        blocks = Blocks(OutputParser(toolset(), incremental=incremental))
        events = blocks.feed(text[:cut]) + blocks.feed(text[cut:]) + blocks.feed("", final=True)
        content = render.fold(events)
        assert [b["type"] for b in content] == ["text", "tool_use"], cut
        assert content[0]["text"] == "Let me check." and content[1]["input"] == {"city": "Paris {x}"}
        assert content[1]["id"].startswith("toolu_") and blocks.called
        starts = [e["index"] for e in events if e["type"] == "content_block_start"]
        stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
        assert starts == stops == [0, 1]


def test_plain_text_is_one_text_block_and_nothing_is_no_block():
    blocks = Blocks(OutputParser(None, incremental=False))
    events = blocks.feed("Hello") + blocks.feed(", world") + blocks.feed("", final=True)
    assert render.fold(events) == [{"type": "text", "text": "Hello, world"}]
    assert Blocks(OutputParser(None, incremental=False)).feed("", final=True) == []


@pytest.mark.parametrize("finish, stop, called, clamped, expected", [
    ("stop", None, False, False, ("end_turn", None)),
    ("stop", "<|im_end|>", False, False, ("end_turn", None)),   # the template's, not the client's
    ("stop", "END", False, False, ("stop_sequence", "END")),
    ("stop", None, True, False, ("tool_use", None)),
    ("length", None, True, False, ("max_tokens", None)),
    ("length", None, False, True, ("model_context_window_exceeded", None)),
])
def test_stop_reasons(finish, stop, called, clamped, expected):
    assert render.stop_reason(finish, stop, stops=["END"], called=called, clamped=clamped) == expected


def test_readme_has_the_current_table():
    readme = (ROOT / "README.md").read_text()
    assert translate.markdown_table() in readme, "README's Messages table is stale: paste translate.markdown_table()"


def roles_and_text(tr):
    return [(m.role, m.content) for m in tr.chat.messages]


def test_system_messages_stand_where_they_are_sent():
    tr = chat_of(system="Top.", messages=[
        {"role": "user", "content": "A"},
        {"role": "system", "content": [{"type": "text", "text": "Mid one."}, {"type": "text", "text": "Mid two."}]},
        {"role": "assistant", "content": "B"},
        {"role": "system", "content": "Only until the next user turn.", "clear_at": "next_user_message"},
        {"role": "user", "content": "C"},
        {"role": "system", "content": "Shown: no user turn after it.", "clear_at": "next_user_message",
         "output_config": {"effort": "low"}},
        {"role": "system", "output_config": {"effort": "high"}}])
    assert roles_and_text(tr) == [("system", "Top."), ("user", "A"), ("system", "Mid one.\nMid two."),
                                  ("assistant", "B"), ("user", "C"), ("system", "Shown: no user turn after it.")]
    assert tr.prefill == ""


def test_a_system_message_between_a_call_and_its_result_keeps_them_paired():
    tr = chat_of(tools=[WEATHER], messages=[
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "system", "content": "Results follow."},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "18C"}]}])
    assert [m.role for m in tr.chat.messages] == ["user", "assistant", "system", "tool"]


NOTE = {"name": "note", "description": "Keep a note.",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}


def change(kind, tool):
    return {"role": "system", "content": [{"type": kind, "tool": tool}]}


def offered(messages, tools=(WEATHER,)):
    tr = chat_of(tools=list(tools), messages=[{"role": "user", "content": "x"}, *messages])
    return [t["function"]["name"] for t in tr.chat.tools or []]


def test_tool_changes_in_system_messages_set_the_tools_offered():
    ref = {"type": "tool_reference", "name": "get_weather"}
    assert offered([change("tool_removal", ref)]) == []
    assert offered([change("tool_removal", ref), change("tool_addition", ref)]) == ["get_weather"]
    inline = {"type": "tool_definition", "definition": NOTE}
    assert offered([change("tool_addition", inline)]) == ["get_weather", "note"]
    assert offered([change("tool_addition", inline), change("tool_removal", ref)]) == ["note"]
    assert offered([change("tool_addition", inline)], tools=()) == ["note"]


@pytest.mark.parametrize("messages, param", [
    ([{"role": "user", "content": "x", "clear_at": "never"}], "messages[0].clear_at"),
    ([{"role": "user", "content": "x", "output_config": {"effort": "low"}}], "messages[0].output_config"),
    ([{"role": "user", "content": "x"}, {"role": "system"}], "messages[1].content"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "y", "output_config": {"format": {}}}],
     "messages[1].output_config.format"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": [{"type": "image", "source": {}}]}],
     "messages[1].content[0].type"),
    ([{"role": "system", "content": "x"}], "messages"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}, {"role": "system", "content": "y"}],
     "messages[1]"),
    ([{"role": "user", "content": "x"}, change("tool_removal", {"type": "tool_reference", "name": "nope"})],
     "messages[1].content[0].tool.name"),
    ([{"role": "user", "content": "x"}, change("tool_addition", {"type": "mcp_tool_reference", "name": "a",
                                                                  "server_name": "s"})],
     "messages[1].content[0].tool.type"),
    ([{"role": "user", "content": "x"}, change("tool_removal", {"type": "tool_definition", "definition": NOTE})],
     "messages[1].content[0].tool"),
    ([{"role": "user", "content": [{"type": "tool_addition", "tool": {}}]}], "messages[0].content[0].type"),
])
def test_system_message_refusals_name_the_field(messages, param):
    with pytest.raises(InvalidRequestError) as e:
        chat_of(tools=[WEATHER], messages=messages)
    assert e.value.param == param and e.value.message


def test_chat_errors_name_what_this_request_sent():
    """The chat machinery names paths by slots; the Messages names replace chat's in the param and
    the message alike, and an image part is named as the block it came from."""
    from openai_ext.text import images
    from openai_ext.text.grammar.errors import check_schema

    with pytest.raises(InvalidRequestError) as e:
        check_schema({"type": "object", "properties": 5}, "tools[0].function.parameters")
    err = translate.chat_error(e.value)
    assert err.param == "tools[0].input_schema.properties"
    assert err.message.startswith("tools[0].input_schema.properties is not a valid JSON Schema")
    assert str(err) == err.message
    names = {"messages[1].content[0]": ("messages[0].content[2]", "url")}
    with pytest.raises(InvalidRequestError) as e:
        images.decode("https://example.com/a.png", "messages[1].content[0].image_url.url")
    err = translate.chat_error(e.value, names)
    assert err.param == "messages[0].content[2].source.url"
    assert err.message == ("messages[0].content[2].source.url is an http URL; this server fetches no URL. Send the "
                           "image itself as a base64 source.")
    err = translate.chat_error(images.no_vision("messages[1].content[0]", False), names)
    assert err.param == "messages[0].content[2].type" and err.message.startswith("messages[0].content[2] is an image")


def test_params_errors_use_anthropics_names_and_words():
    """params.plan's checks name chat's response_format and tool_choice 'required' by slots and
    words; a Messages request hears of output_config.format and 'any'."""
    from openai_ext.hosts.base import HostAbilities
    from openai_ext.text import params
    from openai_ext.text.protocol import ChatCompletionRequest

    bare = HostAbilities(samplers=frozenset())
    fn = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for chat, param, words in (
            ({"tools": [fn], "tool_choice": "required"}, "tool_choice", "tool_choice 'any' or a named function"),
            ({"response_format": {"type": "json_object"}}, "output_config.format", "remove output_config.format.")):
        req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **chat)
        with pytest.raises(InvalidRequestError) as e:
            params.plan(req, abilities=bare, room=10, max_n=1, toolset=tools.parse(req))
        err = translate.chat_error(e.value)
        assert err.param == param and words in err.message and "required" not in err.message
