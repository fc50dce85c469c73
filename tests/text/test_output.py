"""The one output parser: thinking, content and calls cut the same way however the text is split
into pieces, for every family (chat, Messages and Responses only render its events)."""

from __future__ import annotations

import json

import pytest

from openai_ext.text import tools
from openai_ext.text.output import OutputParser, Thinking
from openai_ext.text.protocol import ChatCompletionRequest

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def toolset(**kw):
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                "tools": [WEATHER], **kw})
    return tools.parse(req)


def folded(events):
    """(thinking, content, calls' arguments) of a list of events."""
    thinking = "".join(e.text for e in events if isinstance(e, Thinking))
    content = "".join(e.text for e in events if isinstance(e, tools.Content))
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, tools.CallDelta):
            args[e.index] = args.get(e.index, "") + e.arguments
    return thinking, content, [json.loads(a) for _, a in sorted(args.items())]


@pytest.mark.parametrize("incremental", [True, False])
def test_the_same_events_whatever_the_pieces(incremental):
    text = "<think>Weather, so a call.</think>Let me check." + CALL
    whole = OutputParser(toolset(), incremental=incremental)
    expected = folded(whole.feed(text, final=True))
    assert expected == ("Weather, so a call.", "Let me check.", [{"city": "Paris"}])
    for cut in range(1, len(text)):
        parser = OutputParser(toolset(), incremental=incremental)
        events = parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.feed("", final=True)
        assert folded(events) == expected, cut
        assert parser.called and parser.thinking == "Weather, so a call." and not parser.cut
        # thinking comes before anything of the answer
        kinds = [type(e) for e in events]
        assert kinds.index(tools.Content) > max(i for i, k in enumerate(kinds) if k is Thinking)


def test_without_tools_the_answer_is_content():
    parser = OutputParser(None, incremental=False)
    events = parser.feed("Hel") + parser.feed("lo") + parser.feed("", final=True)
    assert folded(events) == ("", "Hello", []) and parser.calls == [] and not parser.called


def test_a_call_cut_short_is_marked():
    parser = OutputParser(toolset(tool_choice="required"), incremental=True)
    parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    parser.feed("", final=True)
    assert parser.cut == {0}
