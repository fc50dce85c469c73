"""A reasoning model's thinking comes back as a reasoning item ahead of the message, split off by
the host as chat splits it; a model without a reasoning mode gives no reasoning item.

The embedded SmolLM2 has no reasoning mode, so the host here is the real one with a thinking
block put in front of what it generates: the splitter, the items and the events are real."""

from __future__ import annotations

import httpx
import pytest
from support.hosts import THOUGHT, ThinkingHost
from support.responses_api import create, parse_events
from support.servers import openai_client


@pytest.fixture(scope="module")
def thinking(scripted_host, make_server, tmp_path_factory):
    return make_server(ThinkingHost(scripted_host), data_dir=str(tmp_path_factory.mktemp("thinking")))


def test_thinking_is_a_reasoning_item_before_the_message(thinking):
    resp, body = create(openai_client(thinking), input="Name a colour.", max_output_tokens=30,
                        reasoning={"effort": "low"})
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["reasoning", "message"], kinds
    reasoning, message = body["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert reasoning["id"].startswith("rs_") and reasoning["summary"] == []
    text = message["content"][0]["text"]
    assert text and "think>" not in text and THOUGHT not in text
    assert resp.output_text == text and body["reasoning"]["effort"] == "low"


def test_thinking_streams_as_reasoning_text_events(thinking):
    r = httpx.post(f"{thinking.url}/responses", timeout=120,
                   json={"input": "Name a colour.", "stream": True, "max_output_tokens": 30, "temperature": 0})
    events = parse_events(r.text)
    types = [e["type"] for e in events]
    deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(deltas) == THOUGHT and not any("<" in d for d in deltas)
    first_text = types.index("response.output_text.delta")
    # the reasoning item is opened, filled and closed before the message begins
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert events[2]["item"]["type"] == "reasoning" and events[2]["output_index"] == 0
    done = types.index("response.reasoning_text.done")
    assert events[done]["text"] == THOUGHT
    assert types[done:done + 3] == ["response.reasoning_text.done", "response.content_part.done",
                                    "response.output_item.done"]
    assert done < first_text and events[first_text]["output_index"] == 1
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0] == events[done + 2]["item"]


def test_a_model_without_a_reasoning_mode_gives_no_reasoning_item(srclient):
    _, body = create(srclient, input="Name a colour.", max_output_tokens=16, reasoning={"effort": "high"})
    assert [item["type"] for item in body["output"]] == ["message"]


def test_a_compaction_summary_holds_the_answer_not_the_thinking(thinking):
    """The summary a reasoning model writes goes through the one output parser, as every answer
    does: its thinking is not the summary."""
    r = httpx.post(f"{thinking.url}/responses/compact", timeout=120, json={
        "model": "x", "input": [{"role": "user", "content": "Hello there."},
                                {"role": "assistant", "content": "Hi! How can I help?"},
                                {"role": "user", "content": "Tell me about colours."}]})
    assert r.status_code == 200, r.text
    summary = r.json()["output"][-1]
    assert summary["type"] == "compaction"
    from openai_ext.responses import compacted

    text, _ = compacted.decode(summary["encrypted_content"], "output")
    assert text and THOUGHT not in text and "think>" not in text
