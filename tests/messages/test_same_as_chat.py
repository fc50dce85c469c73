"""Property: the Messages API and chat serve the same model the same way. For the same
conversation at temperature 0, /v1/messages and /v1/chat/completions give the same text, the
same token counts and the same end, streamed or not.

The embedded host reuses the cached prefix of the previous prompt, and a prompt evaluated in one
batch can differ from a reused one in the last bits of its logits, which may turn a near tie
the other way. So each pair is compared from the same state: both come right after the same
prompt."""

from __future__ import annotations

import httpx
import pytest
from support.anthropic_types import anthropic_client, assert_events, assert_message, fold_text
from support.servers import openai_client

# (system, Anthropic messages, the same conversation in chat's terms)
CASES = [
    (None, [{"role": "user", "content": "Name three colours of the rainbow."}], None),
    ("You are a terse assistant.", [{"role": "user", "content": "What is 2 + 2?"}], None),
    (None, [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
            {"role": "user", "content": [{"type": "text", "text": "Tell me a fact"},
                                         {"type": "text", "text": "about the sea."}]}],
     [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
      {"role": "user", "content": "Tell me a fact\nabout the sea."}]),
    (None, [{"role": "user", "content": "Write a long story about a robot."}], None),
]


@pytest.mark.parametrize("system, messages, chat_messages", CASES)
@pytest.mark.parametrize("max_tokens", [6, 60])
def test_messages_and_chat_give_the_same_text_at_temperature_0(live, system, messages, chat_messages, max_tokens):
    chat_messages = chat_messages or messages
    if system:
        chat_messages = [{"role": "system", "content": system}, *chat_messages]
    def ask_chat():
        return openai_client(live).chat.completions.create(model="x", messages=chat_messages, temperature=0,
                                                           max_tokens=max_tokens)
    ask_chat()   # the same prompt before each of the two compared below
    extra = {"system": system} if system else {}
    raw = anthropic_client(live).messages.with_raw_response.create(
        model="x", messages=messages, max_tokens=max_tokens, extra_body={"temperature": 0}, **extra)
    chat = ask_chat()
    assert_message(raw.http_response.json())
    msg = raw.parse()
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text == chat.choices[0].message.content
    assert msg.usage.input_tokens == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens
    assert {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason] == msg.stop_reason

    r = httpx.post(f"{live.url}/messages", timeout=120, json={"model": "x", "messages": messages, "stream": True,
                                                               "max_tokens": max_tokens, "temperature": 0, **extra})
    events = assert_events(r.text)
    assert fold_text(events) == text and events[-2]["usage"]["output_tokens"] == msg.usage.output_tokens
