"""What Anthropic's own clients send, replayed on the real model through the anthropic SDK:
context editing that clears old tool results. Each is served while a second client's ordinary
request is served beside it. Every body and event is validated against the SDK's beta types."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.anthropic_types import anthropic_client, assert_events, assert_message

from openai_ext.messages import endpoint

STR = {"type": "string"}
ORDINARY = [{"role": "user", "content": "Name a colour."}]


def beside(server, work):
    """``work()`` while another client's ordinary request is served: both must answer."""
    other = anthropic_client(server)
    with ThreadPoolExecutor(2) as pool:
        theirs = pool.submit(other.messages.with_raw_response.create, model="other", max_tokens=8,
                             messages=ORDINARY, extra_body={"temperature": 0})
        ours = pool.submit(work)
        mine, reply = ours.result(), theirs.result()
    assert_message(reply.http_response.json())
    assert reply.parse().content and reply.parse().stop_reason in ("end_turn", "max_tokens")
    return mine


@pytest.fixture
def claude(live):
    return anthropic_client(live)


@pytest.fixture
def shown(monkeypatch):
    """The chat requests /v1/messages translated, as the model is shown them."""
    seen = []
    real = endpoint.translate.to_chat

    def to_chat(req, **kw):
        tr = real(req, **kw)
        seen.append(tr.chat)
        return tr
    monkeypatch.setattr(endpoint.translate, "to_chat", to_chat)
    return seen


def with_results(chats):
    """The chat requests that carry tool results (the other client's carry none)."""
    return [c for c in chats if any(m.role == "tool" for m in c.messages)]


def stream_text(claude, **body) -> str:
    with claude.beta.messages.with_streaming_response.create(model="claude-sonnet-4-6", stream=True,
                                                             **body) as r:
        return r.read().decode()


LOOKUP = {"name": "lookup", "description": "Look a word up.",
          "input_schema": {"type": "object", "properties": {"word": STR}, "required": ["word"]}}
NOTE = {"name": "note", "description": "Keep a note.",
        "input_schema": {"type": "object", "properties": {"text": STR}, "required": ["text"]}}


def history(n: int) -> list[dict]:
    """n lookups, each with a long result, then a question."""
    turns = [{"role": "user", "content": "Look up some words, then tell me which was longest."}]
    for k in range(n):
        use = ("note", {"text": "start"}) if k == 0 else ("lookup", {"word": f"word{k}"})
        turns.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{k}", "name": use[0], "input": use[1]}]})
        turns.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{k}",
             "content": f"Entry {k}: " + "a long definition with many words in it, " * 12}]})
    turns.append({"role": "user", "content": "Which word was longest?"})
    return turns


def cleared(turns: list[dict], results: set[str], inputs: set[str] = frozenset()) -> list[dict]:
    """``turns`` with the results of the tool uses ``results`` and the inputs of ``inputs``
    cleared, as Anthropic documents it."""
    out = json.loads(json.dumps(turns))
    for m in out:
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b["type"] == "tool_result" and b["tool_use_id"] in results:
                b["content"] = "[This tool result was cleared to save context.]"
            if b["type"] == "tool_use" and b["id"] in inputs:
                b["input"] = {}
    return out


OLDEST = {"toolu_0", "toolu_1", "toolu_2"}     # all tool uses but the last two of five
CLEAR = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 300},
         "keep": {"type": "tool_uses", "value": 2}}


def test_clear_tool_uses_past_its_trigger_clears_old_results(live, claude, shown):
    turns = history(5)
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}, CLEAR]}
    count = claude.beta.messages.count_tokens
    whole = count(model="x", messages=turns, tools=[LOOKUP, NOTE]).input_tokens
    assert whole > 300
    # the three oldest results are replaced by a note in what the model is shown
    seen = count(model="x", messages=cleared(turns, OLDEST), tools=[LOOKUP, NOTE])
    counted = count(model="x", messages=turns, tools=[LOOKUP, NOTE], context_management=edits)
    assert (counted.input_tokens, counted.context_management.original_input_tokens) == (seen.input_tokens, whole)

    def ask():
        return stream_text(claude, messages=turns, tools=[LOOKUP, NOTE], max_tokens=8, context_management=edits,
                           betas=["context-management-2025-06-27"], extra_body={"temperature": 0})
    events = assert_events(beside(live, ask), beta=True)
    assert events[0]["message"]["usage"]["input_tokens"] == seen.input_tokens
    report = next(e for e in events if e["type"] == "message_delta")["context_management"]
    assert report == {"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3,
                                         "cleared_input_tokens": whole - seen.input_tokens}]}
    tool_messages = [m.content for m in with_results(shown)[-1].messages if m.role == "tool"]
    assert tool_messages[:3] == ["[This tool result was cleared to save context.]"] * 3
    assert all(t.startswith("Entry") for t in tool_messages[3:]) and len(tool_messages) == 5
    # not streamed: the same edit, reported in the message
    raw = claude.beta.messages.with_raw_response.create(model="x", messages=turns, tools=[LOOKUP, NOTE], max_tokens=4,
                                                        context_management=edits, extra_body={"temperature": 0})
    msg = assert_message(raw.http_response.json(), beta=True)
    assert msg.context_management.applied_edits[0].cleared_tool_uses == 3
    assert msg.usage.input_tokens == seen.input_tokens


@pytest.mark.parametrize("edit, results, inputs", [
    ({"exclude_tools": ["note"]}, {"toolu_1", "toolu_2"}, set()),           # note's use stays whole
    ({"clear_tool_inputs": True}, OLDEST, OLDEST),
    ({"clear_tool_inputs": ["lookup"]}, OLDEST, {"toolu_1", "toolu_2"}),    # note's input stays
    ({"trigger": {"type": "tool_uses", "value": 4}}, OLDEST, set()),        # five uses: more than four
])
def test_clear_tool_uses_options(claude, edit, results, inputs):
    turns = history(5)
    count = claude.beta.messages.count_tokens
    counted = count(model="x", messages=turns, tools=[LOOKUP, NOTE], context_management={"edits": [{**CLEAR, **edit}]})
    assert counted.input_tokens == count(model="x", messages=cleared(turns, results, inputs),
                                         tools=[LOOKUP, NOTE]).input_tokens


@pytest.mark.parametrize("edit", [
    {"trigger": {"type": "input_tokens", "value": 100_000}},     # not passed
    {"trigger": {"type": "tool_uses", "value": 5}},              # five uses: not more than five
    {"clear_at_least": {"type": "input_tokens", "value": 100_000}},   # would clear too little
    {"keep": {"type": "tool_uses", "value": 5}},                 # keeps them all
])
def test_clear_tool_uses_that_does_not_apply_clears_nothing(claude, edit):
    turns = history(5)
    raw = claude.beta.messages.with_raw_response.create(
        model="x", messages=turns, tools=[LOOKUP, NOTE], max_tokens=2, context_management={"edits": [{**CLEAR, **edit}]},
        extra_body={"temperature": 0})
    msg = assert_message(raw.http_response.json(), beta=True)
    assert msg.context_management.applied_edits == []
    assert msg.usage.input_tokens == claude.messages.count_tokens(model="x", messages=turns,
                                                                  tools=[LOOKUP, NOTE]).input_tokens
