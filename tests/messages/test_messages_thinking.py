"""A reasoning model's thinking comes back as a thinking block ahead of the answer, split off by
the host as chat splits it; thinking in the request reaches the model's reasoning switch.

The embedded SmolLM2 has no reasoning mode, so the host here is the real one with a thinking
block put in front of what it generates: the splitter, the blocks and the events are real."""

from __future__ import annotations

import httpx
import pytest
from support.anthropic_types import anthropic_client, assert_events, assert_message
from support.hosts import THOUGHT, ThinkingHost

from openai_ext.messages import translate
from openai_ext.messages.protocol import MessagesRequest

Q = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def thinking(scripted_host, make_server):
    return make_server(ThinkingHost(scripted_host))


def test_thinking_is_a_block_before_the_text(thinking):
    raw = anthropic_client(thinking).messages.with_raw_response.create(
        model="x", max_tokens=1025, messages=Q, thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"temperature": 0})   # greedy: a short answer, whatever the budget
    body = raw.http_response.json()
    assert_message(body)
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert body["content"][0]["thinking"] == THOUGHT
    assert "think>" not in body["content"][1]["text"] and body["content"][1]["text"]
    assert raw.parse().content[0].type == "thinking"


def test_thinking_streams_as_thinking_deltas(thinking):
    r = httpx.post(f"{thinking.url}/messages", timeout=120,
                   json={"model": "x", "stream": True, "max_tokens": 30, "messages": Q})
    events = [e for e in assert_events(r.text) if e["type"] != "ping"]
    types = [e["type"] for e in events]
    assert events[1] == {"type": "content_block_start", "index": 0,
                         "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
    thoughts = [e["delta"]["thinking"] for e in events if e["type"] == "content_block_delta"
                and e["delta"]["type"] == "thinking_delta"]
    assert "".join(thoughts) == THOUGHT
    stop = types.index("content_block_stop")
    assert events[stop]["index"] == 0 and types[stop + 1] == "content_block_start"
    assert events[stop + 1]["content_block"]["type"] == "text" and events[stop + 1]["index"] == 1
    assert all(e["delta"]["type"] == "text_delta" for e in events[stop + 2:] if e["type"] == "content_block_delta")


def test_the_thinking_switch_reaches_the_template():
    def chat_of(**kw):
        req = MessagesRequest.model_validate({"model": "x", "max_tokens": 2048, "messages": Q, **kw})
        return translate.to_chat(req).chat.model_extra or {}
    assert chat_of(thinking={"type": "enabled", "budget_tokens": 1024})["enable_thinking"] is True
    assert chat_of(thinking={"type": "disabled"})["enable_thinking"] is False
    assert "enable_thinking" not in chat_of()
    # the web UI's own fields travel as in chat, rather than being dropped
    assert chat_of(mode="instruct", min_p=0.1) == {"mode": "instruct", "min_p": 0.1}
