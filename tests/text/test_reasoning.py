"""Thinking apart from the answer as a reply streams: following the <think> tags' split as text
arrives gives exactly what asking the splitter about the whole reply at every token gives."""

from __future__ import annotations

import random

import httpx
import pytest
from support.anthropic_types import assert_events
from support.hosts import THOUGHT, OpenedThinkingHost
from support.responses_api import parse_events
from support.servers import openai_client

from openai_ext.hosts.base import split_think_tags
from openai_ext.text import reasoning
from openai_ext.text.reasoning import ReasoningStream

WORDS = ["<think>", "</think>", "<", "</", "<b", "think", ">", "/", " ", "\n", "a", "bc", "<think", "</thi",
         "nk>", "x" * 30]


def asking() -> ReasoningStream:
    """A stream that asks the splitter about the whole reply every time (not followed)."""
    return ReasoningStream(lambda text: split_think_tags(text))


def test_following_the_tags_gives_what_asking_gives():
    rng = random.Random(5)
    for _ in range(3000):
        start = rng.choice(["", " ", "\n", "<think>", " <think>\n", "<th"])
        pieces = [start] + [rng.choice(WORDS) for _ in range(rng.randint(0, 14))]
        followed, asked = ReasoningStream(), asking()
        for i, piece in enumerate(pieces):
            final = i == len(pieces) - 1 and rng.random() < 0.5
            assert followed.feed(piece, final=final) == asked.feed(piece, final=final), pieces
        assert (followed.text, followed._content) == (asked.text, asked._content)


def test_a_tag_like_end_before_a_newline_is_thinking_that_comes_out():
    stream = ReasoningStream()
    got = [stream.feed(t) for t in ["<think>", "see a <b", "\n", "then c", "</think>", "Done"]]
    assert "".join(t for t, _ in got) == "see a <b\nthen c"
    assert "".join(c for _, c in got) == "Done"


@pytest.mark.parametrize("reply", [["<think>", *["step "] * 500, "</think>", *["word "] * 500],
                                   ["word "] * 1000])
def test_a_long_reply_is_not_split_again_at_every_token(monkeypatch, reply):
    asked = []

    def counting(text: str) -> tuple[str | None, str]:
        asked.append(len(text))
        return split_think_tags(text)

    monkeypatch.setattr(reasoning, "split_think_tags", counting)
    stream = ReasoningStream()
    got = [stream.feed(t) for t in reply] + [stream.feed("", final=True)]
    assert len(asked) <= 3
    whole = split_think_tags("".join(reply))
    assert ("".join(t for t, _ in got) or None, "".join(c for _, c in got)) == whole


@pytest.fixture(scope="module")
def opened(scripted_host, make_server):
    return make_server(OpenedThinkingHost(scripted_host))


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_a_template_opened_comes_back_apart(opened, script, stream):
    # The template ends the prompt with <think>: the reply has only the closing tag. Streamed, as
    # whole, the thinking is reasoning_content and the answer is content, nothing of either lost.
    script.script("Blue is a colour.")
    client = openai_client(opened)
    messages = [{"role": "user", "content": "Name a colour."}]
    if not stream:
        message = client.chat.completions.create(model="x", messages=messages).choices[0].message
        thinking, content = message.model_extra.get("reasoning_content"), message.content
    else:
        chunks = list(client.chat.completions.create(model="x", messages=messages, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        thinking = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
        content = "".join(d.content or "" for d in deltas)
    assert (thinking, content) == (THOUGHT, "Blue is a colour.")


def test_thinking_a_template_opened_is_a_reasoning_item_and_a_thinking_block_streamed(opened, script):
    # The same reply through the Responses and Messages streams: thinking first, the answer after.
    script.script("Blue is a colour.", "Blue is a colour.")
    r = httpx.post(f"{opened.url}/responses", timeout=60,
                   json={"model": "x", "input": "Name a colour.", "stream": True, "max_output_tokens": 60})
    events = parse_events(r.text)
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    answer = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert (reasoning, answer) == (THOUGHT, "Blue is a colour.")
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    r = httpx.post(f"{opened.url}/messages", timeout=60,
                   json={"model": "x", "stream": True, "max_tokens": 60,
                         "messages": [{"role": "user", "content": "Name a colour."}]})
    events = [e for e in assert_events(r.text) if e["type"] == "content_block_delta"]
    thinking = "".join(e["delta"].get("thinking", "") for e in events)
    text = "".join(e["delta"].get("text", "") for e in events)
    assert (thinking, text) == (THOUGHT, "Blue is a colour.")
    assert [e["index"] for e in events] == sorted(e["index"] for e in events)   # thinking's block first


def test_a_host_splitter_that_sees_only_the_reply_streams_thinking_a_template_opened(host_modules):
    # The web UI's splitter finds thinking that has no opening tag only once </think> has come: a
    # stream would have sent it as the answer by then. Read as opened, it is thinking throughout.
    split = host_modules.reasoning.extract_reasoning
    pieces = [THOUGHT[:10], THOUGHT[10:] + "</th", "ink>\n\n", "Blue", " is a colour."]

    def streamed(opened: bool) -> tuple[str, str]:
        stream = ReasoningStream(split, opened=opened)
        got = [stream.feed(p) for p in pieces] + [stream.feed("", final=True)]
        return "".join(t for t, _ in got), "".join(c for _, c in got)

    assert streamed(True) == (THOUGHT, "Blue is a colour.")
    assert streamed(False)[1].startswith(THOUGHT[:10])   # what it was without: thinking sent as the answer
    assert split(THOUGHT + "</think>\n\nBlue") == (THOUGHT, "Blue")   # (the double has the end-only format)
