"""/v1/messages in extension mode, against the test double of the web UI (tests/doubles): the same
code over the web UI's host, its prompt builder and its generation."""

from __future__ import annotations

import httpx
import pytest
from support.anthropic_types import anthropic_client, assert_error, assert_events, assert_message, parse_events


@pytest.fixture
def claude(extension):
    return anthropic_client(extension.server)


def create(claude, **kw):
    raw = claude.messages.with_raw_response.create(model="local-model", **kw)
    assert_message(raw.http_response.json())
    return raw.parse()


def test_messages_go_through_the_hosts_prompt_builder(claude, host_modules):
    tg, chat, shared = host_modules.text_generation, host_modules.chat, host_modules.shared
    msg = create(claude, system="You are terse.", max_tokens=50, stop_sequences=["never"], metadata={"user_id": "u"},
                 messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                           {"role": "user", "content": [{"type": "text", "text": "Greet the world"}]}],
                 extra_body={"temperature": 0.5})
    assert msg.model == shared.model_name and msg.content[0].text == "Hello, world!"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    question, state, _, _ = tg.CALLS[-1]
    user_input, prompt_state = chat.CALLS[-1]
    assert user_input == "Greet the world" and prompt_state["custom_system_message"] == "You are terse."
    assert question.startswith("<|im_start|>system\nYou are terse.<|im_end|>")
    assert state["max_new_tokens"] == 50 and state["temperature"] == 0.5
    # exact usage, from the host's tokenizer
    assert msg.usage.input_tokens == len(tg.encode(question)[0])
    assert msg.usage.output_tokens == len("Hello, world!".encode())
    assert claude.messages.count_tokens(model="x", system="You are terse.", messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Greet the world"}]).input_tokens == msg.usage.input_tokens
    assert not shared.generation_lock.locked()


def test_stream_through_the_host(extension, claude):
    r = httpx.post(f"{extension.server.url}/messages", timeout=30,
                   json={"model": "x", "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "x"}]})
    events = assert_events(r.text)
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "Hello, world!"
    assert events[-2]["delta"]["stop_reason"] == "end_turn"
    with claude.messages.stream(model="x", max_tokens=100, messages=[{"role": "user", "content": "x"}]) as s:
        assert "".join(s.text_stream) == "Hello, world!"


def test_stop_sequence_split_across_host_tokens(claude, host_modules):
    host_modules.text_generation.SCRIPT = ["The", " wor", "ld", " is", " round"]
    msg = create(claude, max_tokens=20, stop_sequences=["orld"], messages=[{"role": "user", "content": "x"}])
    assert msg.content[0].text == "The w" and msg.stop_reason == "stop_sequence" and msg.stop_sequence == "orld"
    assert msg.usage.output_tokens == 2   # the tokens returned: "ld" is all stop sequence


def test_max_tokens_from_the_host(claude, host_modules):
    host_modules.text_generation.SCRIPT = ["a", "b", "c", "d", "e", "f"]
    msg = create(claude, max_tokens=3, messages=[{"role": "user", "content": "x"}])
    assert msg.content[0].text == "abc" and msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 3


def test_host_failure_mid_stream_is_an_error_event(extension, host_modules):
    host_modules.text_generation.FAIL_AFTER = 2
    r = httpx.post(f"{extension.server.url}/messages", timeout=30,
                   json={"model": "x", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "x"}]})
    events = parse_events(r.text)
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert_error(events[-1][1], "api_error")
    assert not host_modules.shared.generation_lock.locked()
    host_modules.text_generation.FAIL_AFTER = None


def test_a_tool_call_through_the_host(claude, host_modules):
    """One tool forced: the server writes the call's start into the prompt, and the host's model
    (bound by the grammar to the arguments and the closing brace) writes the rest."""
    tg = host_modules.text_generation
    rest = '{"city": "Paris"}}'
    tg.SCRIPT = [rest[i:i + 5] for i in range(0, len(rest), 5)]   # split across host tokens
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                    "required": ["city"]}}
    msg = create(claude, max_tokens=100, tools=[tool], tool_choice={"type": "any"},
                 messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert [(b.type, b.name, b.input) for b in msg.content] == [("tool_use", "get_weather", {"city": "Paris"})]
    assert msg.stop_reason == "tool_use"
    prompt, state, _, _ = tg.CALLS[-1]
    assert "get_weather" in state["grammar_string"]    # the host's loader is given the call grammar
    assert state["grammar_string"].startswith("root ::= fn0-arguments")
    assert prompt.endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
