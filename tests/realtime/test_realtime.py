"""The Realtime API over a real WebSocket, driven by openai-python's realtime client
(``client.realtime.connect``): text turns, spoken turns (piper speech in, Whisper, the model,
piper speech out), tools, bad events and the guards. Every server event is validated against
the spec's schema for its type (the members of the RealtimeServerEvent union)."""

from __future__ import annotations

import functools
import json

import openai
import pytest
from support.spec import _spec, assert_valid

KEY = "sk-realtime-test"
MODEL = "gpt-realtime"


@functools.cache
def schema_of() -> dict[str, str]:
    """Server event type -> its schema's name, from the spec's union of server events."""
    schemas = _spec()["components"]["schemas"]
    out = {}
    for ref in schemas["RealtimeServerEvent"]["anyOf"]:
        name = ref["$ref"].rsplit("/", 1)[-1]
        out[schemas[name]["properties"]["type"]["enum"][0]] = name
    return out


def check(event: dict) -> dict:
    name = schema_of().get(event["type"])
    assert name is not None, f"{event['type']} is not a server event of the spec"
    assert_valid(name, event)
    return event


@pytest.fixture(scope="module")
def rt(llama_host, make_server):
    return make_server(llama_host, api_key=KEY, realtime_max_frame_kb=64, realtime_max_sessions=2)


def client(server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0)


class Events:
    """The raw events of a connection, each validated as it comes."""

    def __init__(self, connection):
        self.connection = connection
        self.seen: list[dict] = []

    def next(self) -> dict:
        event = check(json.loads(self.connection.recv_bytes()))
        self.seen.append(event)
        return event

    def until(self, *types: str) -> list[dict]:
        out = []
        while True:
            event = self.next()
            out.append(event)
            if event["type"] in types:
                return out


def of(events: list[dict], type_: str) -> list[dict]:
    return [e for e in events if e["type"] == type_]


def test_a_text_turn(rt):
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        created = events.next()
        assert created["type"] == "session.created" and created["session"]["model"] == MODEL
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "instructions": "Answer in one short sentence.",
                                           "max_output_tokens": 24})
        updated = events.next()
        assert updated["type"] == "session.updated" and updated["session"]["output_modalities"] == ["text"]
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "What is the capital of France?"}]})
        added = events.until("conversation.item.done")
        user_id = added[-1]["item"]["id"]
        connection.response.create()
        out = events.until("response.done")
        types = [e["type"] for e in out]
        assert types[0] == "response.created"
        deltas = of(out, "response.output_text.delta")
        done = of(out, "response.output_text.done")[0]
        assert deltas and "".join(d["delta"] for d in deltas) == done["text"] and done["text"]
        final = out[-1]["response"]
        assert final["status"] in ("completed", "incomplete")
        assert final["usage"]["input_tokens"] > 0 and final["usage"]["output_tokens"] > 0
        assert final["output"][0]["content"][0] == {"type": "output_text", "text": done["text"]}
        assert types.index("response.output_item.added") < types.index("response.content_part.added") \
            < types.index("response.output_text.delta") < types.index("response.content_part.done") \
            < types.index("response.output_item.done") < types.index("response.done")
        # the answer is in the conversation, after the question
        connection.send({"type": "conversation.item.retrieve", "item_id": final["output"][0]["id"]})
        got = events.next()
        assert got["type"] == "conversation.item.retrieved" and got["item"]["content"][0]["text"] == done["text"]
        assert of(out, "conversation.item.added")[0]["previous_item_id"] == user_id
