"""Messages in the generation queue: pings while a stream waits its turn, overloaded_error (529)
when the line is full, and a client that leaves stops its generation. Order and progress are
read from the events, not from clocks."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from support.anthropic_types import anthropic_client, assert_error
from support.scripted import held
from support.servers import idle

from openai_ext.messages import stream as messages_stream

LONG = {"model": "x", "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500, "temperature": 0, "stream": True}


def events(response):
    """(event, data) pairs as they arrive."""
    name = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            yield name, json.loads(line[len("data: "):])


@pytest.fixture
def produced(scripted_host, monkeypatch):
    """How many pieces the host has produced so far."""
    count = [0]
    real = scripted_host.generate

    def generate(prompt, settings, stop_event):
        for piece in real(prompt, settings, stop_event):
            count[0] += 1
            yield piece
    monkeypatch.setattr(scripted_host, "generate", generate)
    return count


def test_waiting_stream_pings_then_a_full_line_is_overloaded(script, make_server, monkeypatch):
    monkeypatch.setattr(messages_stream, "PING_INTERVAL", 0.05)
    script.script(held())   # the first generates two tokens, then holds its place until it leaves
    server = make_server(script, max_queue=1)
    with httpx.stream("POST", server.url + "/messages", json=LONG, timeout=60) as first:
        running = events(first)
        assert next(running)[0] == "message_start"
        while next(running)[0] != "content_block_delta":   # the first one generates now
            pass
        with httpx.stream("POST", server.url + "/messages", json=LONG, timeout=60) as second:
            waiting = events(second)
            assert next(waiting)[0] == "message_start"     # admitted, and told so at once
            pings = 0
            for name, data in waiting:                      # while its turn has not come, it pings
                assert name == "ping" and data == {"type": "ping"}, name
                pings += 1
                if pings == 3:
                    break
            # the line holds one waiting request: a third is refused at once
            with pytest.raises(anthropic.OverloadedError) as e:
                anthropic_client(server).messages.create(model="x", max_tokens=5, messages=LONG["messages"])
            assert e.value.status_code == 529
            assert_error(e.value.body, "overloaded_error")
            assert e.value.response.headers["retry-after"]
            first.close()                                   # the first leaves: the second's turn comes
            kinds = set()
            for name, _ in waiting:
                kinds.add(name)
                if name == "content_block_delta":
                    break
            assert "content_block_start" in kinds
    assert idle(server, script)


def test_a_client_that_leaves_stops_the_generation(scripted, scripted_host, produced):
    reply = scripted_host.script(held(at=12))[0]   # 12 tokens, then it waits until stopped
    with httpx.stream("POST", scripted.url + "/messages", json=LONG, timeout=60) as r:
        deltas = 0
        for name, _ in events(r):
            deltas += name == "content_block_delta"
            if deltas == 10:
                break
        at_leaving = produced[0]
    assert idle(scripted, scripted_host), "the generation ran on, or kept its place in line"
    assert produced[0] - at_leaving <= 3, "tokens generated after the client left"
    assert produced[0] < 100 and reply.ended.is_set()
    ok = anthropic_client(scripted).messages.create(model="x", max_tokens=3, messages=LONG["messages"])
    assert ok.usage.output_tokens == 3
