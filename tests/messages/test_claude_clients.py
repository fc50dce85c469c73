"""What Anthropic's own clients send, replayed through the anthropic SDK on the scripted host (the
tool runner, whose loop needs a model's calls, on the real model):
Claude Code's first request (system blocks with cache_control, a tool list, metadata,
context_management, thinking or not, streamed), a system message in the middle of the
conversation, context editing that clears old tool results, and the SDK's tool runner, which
keeps its conversation in a server-held thread. Each is served while a second client's ordinary
request is served beside it. Every body and event is validated against the SDK's beta types."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from jsonschema import Draft202012Validator
from support.anthropic_types import anthropic_client, assert_events, assert_message, fold_text, parse_events

from openai_ext.messages import endpoint, threads

BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27",
         "fine-grained-tool-streaming-2025-05-14"]
SYSTEM = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
     "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks. "
                             "Be concise. Use the tools to read and change files.",
     "cache_control": {"type": "ephemeral"}}]


def tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "properties": properties, "required": required,
                             "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}}


STR = {"type": "string"}
TOOLS = [
    tool("Bash", "Run a shell command.", {"command": STR, "timeout": {"type": "number"},
                                          "description": STR, "run_in_background": {"type": "boolean"}}, ["command"]),
    tool("Glob", "Find files by pattern.", {"pattern": STR, "path": STR}, ["pattern"]),
    tool("Grep", "Search file contents.", {"pattern": STR, "path": STR, "glob": STR,
                                           "output_mode": {"type": "string", "enum": ["content", "files_with_matches",
                                                                                      "count"]},
                                           "-i": {"type": "boolean"}, "head_limit": {"type": "number"}}, ["pattern"]),
    tool("Read", "Read a file.", {"file_path": STR, "offset": {"type": "number"}, "limit": {"type": "number"}},
         ["file_path"]),
    tool("Edit", "Replace text in a file.", {"file_path": STR, "old_string": STR, "new_string": STR,
                                             "replace_all": {"type": "boolean", "default": False}},
         ["file_path", "old_string", "new_string"]),
    tool("Write", "Write a file.", {"file_path": STR, "content": STR}, ["file_path", "content"]),
    tool("TodoWrite", "Update the todo list.", {"todos": {"type": "array", "items": {
        "type": "object", "properties": {"content": STR, "status": {"type": "string", "enum": ["pending",
                                                                                              "in_progress",
                                                                                              "completed"]},
                                         "activeForm": STR},
        "required": ["content", "status", "activeForm"], "additionalProperties": False}}}, ["todos"]),
    tool("WebFetch", "Fetch a URL.", {"url": {"type": "string", "format": "uri"}, "prompt": STR}, ["url", "prompt"]),
]
FIRST_TURN = [{"role": "user", "content": [
    {"type": "text", "text": "<system-reminder>\nThis is a reminder that your todo list is empty.\n</system-reminder>"},
    {"type": "text", "text": "Say hello in one short sentence.", "cache_control": {"type": "ephemeral"}}]}]
METADATA = {"user_id": "user_" + "ab" * 32 + "_account__session_5f0c2a7e-9d51-4f7b-8d0e-1c2b3a4d5e6f"}
KEEP_ALL = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
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


@pytest.mark.parametrize("thinking", [None, {"type": "enabled", "budget_tokens": 1024}])
def test_claude_code_first_request(scripted, sclaude, thinking):
    body = dict(system=SYSTEM, tools=TOOLS, messages=FIRST_TURN, metadata=METADATA, context_management=KEEP_ALL,
                max_tokens=1100 if thinking else 64, betas=BETAS)
    if thinking:
        body["thinking"] = thinking
    # greedy and short, so the small model answers quickly: the rest is what Claude Code sends
    text = beside(scripted, lambda: stream_text(sclaude, **body, extra_body={"temperature": 0},
                                            extra_query={"beta": "true"}))
    events = assert_events(text, beta=True)
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["context_management"] == {"applied_edits": []}      # keep all: nothing to clear
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use", "model_context_window_exceeded")
    assert [e for e in events if e["type"] == "content_block_start"]
    counted = sclaude.beta.messages.count_tokens(model="x", system=SYSTEM, tools=TOOLS, messages=FIRST_TURN,
                                                context_management=KEEP_ALL, betas=BETAS)
    assert counted.input_tokens == events[0]["message"]["usage"]["input_tokens"]
    assert counted.context_management.original_input_tokens == counted.input_tokens


def test_a_system_message_in_the_middle_is_shown_in_place(scripted, sclaude, shown):
    turns = [{"role": "user", "content": "Hi, I need help with a script."},
             {"role": "assistant", "content": "Sure, what does it do?"},
             {"role": "system", "content": [{"type": "text", "text": "RULE: answer in one word."}]},
             {"role": "user", "content": "It copies files."}]
    raw = beside(scripted, lambda: sclaude.beta.messages.with_raw_response.create(
        model="x", max_tokens=16, system="You help with code.", messages=turns, extra_body={"temperature": 0}))
    assert_message(raw.http_response.json(), beta=True)
    assert raw.parse().content[0].text.strip()
    mine = [c for c in shown if c.messages[0].content == "You help with code."]
    assert [(m.role, m.content) for m in mine[0].messages] == [
        ("system", "You help with code."), ("user", "Hi, I need help with a script."),
        ("assistant", "Sure, what does it do?"), ("system", "RULE: answer in one word."),
        ("user", "It copies files.")]
    # the same text, counted as /v1/messages renders it: the system message is part of the prompt
    without = [t for t in turns if t["role"] != "system"]
    count = sclaude.beta.messages.count_tokens
    assert count(model="x", messages=turns).input_tokens > count(model="x", messages=without).input_tokens


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


def test_clear_tool_uses_past_its_trigger_clears_old_results(scripted, sclaude, shown):
    turns = history(5)
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}, CLEAR]}
    count = sclaude.beta.messages.count_tokens
    whole = count(model="x", messages=turns, tools=[LOOKUP, NOTE]).input_tokens
    assert whole > 300
    # the three oldest results are replaced by a note in what the model is shown
    seen = count(model="x", messages=cleared(turns, OLDEST), tools=[LOOKUP, NOTE])
    counted = count(model="x", messages=turns, tools=[LOOKUP, NOTE], context_management=edits)
    assert (counted.input_tokens, counted.context_management.original_input_tokens) == (seen.input_tokens, whole)

    def ask():
        return stream_text(sclaude, messages=turns, tools=[LOOKUP, NOTE], max_tokens=8, context_management=edits,
                           betas=["context-management-2025-06-27"], extra_body={"temperature": 0})
    events = assert_events(beside(scripted, ask), beta=True)
    assert events[0]["message"]["usage"]["input_tokens"] == seen.input_tokens
    report = next(e for e in events if e["type"] == "message_delta")["context_management"]
    assert report == {"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3,
                                         "cleared_input_tokens": whole - seen.input_tokens}]}
    tool_messages = [m.content for m in with_results(shown)[-1].messages if m.role == "tool"]
    assert tool_messages[:3] == ["[This tool result was cleared to save context.]"] * 3
    assert all(t.startswith("Entry") for t in tool_messages[3:]) and len(tool_messages) == 5
    # not streamed: the same edit, reported in the message
    raw = sclaude.beta.messages.with_raw_response.create(model="x", messages=turns, tools=[LOOKUP, NOTE], max_tokens=4,
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
def test_clear_tool_uses_options(sclaude, edit, results, inputs):
    turns = history(5)
    count = sclaude.beta.messages.count_tokens
    counted = count(model="x", messages=turns, tools=[LOOKUP, NOTE], context_management={"edits": [{**CLEAR, **edit}]})
    assert counted.input_tokens == count(model="x", messages=cleared(turns, results, inputs),
                                         tools=[LOOKUP, NOTE]).input_tokens


@pytest.mark.parametrize("edit", [
    {"trigger": {"type": "input_tokens", "value": 100_000}},     # not passed
    {"trigger": {"type": "tool_uses", "value": 5}},              # five uses: not more than five
    {"clear_at_least": {"type": "input_tokens", "value": 100_000}},   # would clear too little
    {"keep": {"type": "tool_uses", "value": 5}},                 # keeps them all
])
def test_clear_tool_uses_that_does_not_apply_clears_nothing(sclaude, edit):
    turns = history(5)
    raw = sclaude.beta.messages.with_raw_response.create(
        model="x", messages=turns, tools=[LOOKUP, NOTE], max_tokens=2, context_management={"edits": [{**CLEAR, **edit}]},
        extra_body={"temperature": 0})
    msg = assert_message(raw.http_response.json(), beta=True)
    assert msg.context_management.applied_edits == []
    assert msg.usage.input_tokens == sclaude.messages.count_tokens(model="x", messages=turns,
                                                                  tools=[LOOKUP, NOTE]).input_tokens


def test_the_tool_runner_runs_a_tool_loop_on_a_kept_thread(live, claude, shown, monkeypatch):
    from anthropic import beta_tool

    sent = []
    real = threads.Threads.resolve

    def resolve(self, req, owner):
        sent.append(((req.thread or {}).get("type"), len(req.messages), req.tools is not None))
        return real(self, req, owner)
    monkeypatch.setattr(threads.Threads, "resolve", resolve)
    ran = []

    @beta_tool
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: The city's name.
        """
        ran.append(city)
        return f"18 degrees and sunny in {city}"

    def loop():
        runner = claude.beta.messages.tool_runner(
            model="x", max_tokens=60, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[get_weather], tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"temperature": 0})
        replies = []
        for message in runner:
            replies.append(message)
            if len(replies) == 1:    # the tool was called: now the model answers in words
                runner.set_messages_params(lambda p: {**p, "tool_choice": {"type": "none"}})
        return replies
    replies = beside(live, loop)
    first, last = replies[0], replies[-1]
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    assert Draft202012Validator(get_weather.to_dict()["input_schema"]).is_valid(uses[0].input)
    assert ran == [uses[0].input["city"]]
    assert len(replies) == 2 and last.stop_reason in ("end_turn", "max_tokens") and last.content[0].text.strip()
    # the first turn created the thread with the tools; the second sent only the tool's result
    mine = [s for s in sent if s[0] is not None]
    assert mine == [("create", 1, True), ("continue", 1, False)]
    # and the model was shown the whole conversation: the call and its result
    last_shown = with_results(shown)[-1].messages
    assert [m.role for m in last_shown][-3:] == ["user", "assistant", "tool"]
    assert last_shown[-1].content == f"18 degrees and sunny in {ran[0]}"
    assert last_shown[-2].tool_calls[0].id == uses[0].id


def test_the_kept_thread_is_what_the_next_turn_continues(scripted, sclaude):
    """The SDK's thread: each turn sends only its new message; the model is shown all of them."""
    def talk():
        thread = sclaude.beta.messages.thread(model="x", max_tokens=8, system="Be brief.",
                                             extra_body={"temperature": 0})
        one = thread.send({"role": "user", "content": "Say one word."})
        two = thread.send({"role": "user", "content": "Say another word."})
        return thread, one, two
    thread, one, two = beside(scripted, talk)
    assert thread.previous_message_id == two.id and one.id != two.id
    assert two.usage.input_tokens > one.usage.input_tokens + one.usage.output_tokens
    whole = sclaude.messages.count_tokens(model="x", system="Be brief.", messages=list(thread.messages)[:3])
    assert two.usage.input_tokens == whole.input_tokens


def test_stream_events_of_a_thread_are_kept_too(sclaude, scripted):
    first = stream_text(sclaude, max_tokens=6, messages=[{"role": "user", "content": "Count: one, two,"}],
                        thread={"type": "create"}, extra_body={"temperature": 0})
    start = parse_events(first)[0][1]["message"]
    text = fold_text(assert_events(first, beta=True))
    second = sclaude.beta.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "More."}],
                                         thread={"type": "continue", "previous_message_id": start["id"]},
                                         extra_body={"temperature": 0})
    whole = sclaude.messages.count_tokens(model="x", messages=[
        {"role": "user", "content": "Count: one, two,"}, {"role": "assistant", "content": text},
        {"role": "user", "content": "More."}])
    assert second.usage.input_tokens == whole.input_tokens
