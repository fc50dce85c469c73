"""The schemas coding agents and SDKs send, replayed on the real SmolLM2 model: each request is
served while a second client's ordinary request is served beside it, and /health answers while
the first one's grammar is being prepared. Shown by events (the preparation is held at its first
grammar rule until /health has answered), never by timing.

- Claude Code's Workflow tool: a string with maxLength 524288 (its grammar was once written out
  character by character, held the server for minutes and then crashed it), beside ordinary tools;
- Claude Code's SendMessage: zod's allOf of two patterns (once a 400 for the whole request);
- pydantic's ge/le under strict, through the openai SDK's .parse() and pydantic_function_tool
  (once a 400: minimum could not be enforced).
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from support.anthropic_types import anthropic_client
from support.hostile_schemas import HOSTILE
from support.servers import openai_client

from openai_ext.text.grammar import converter

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}
READ = {"type": "function", "function": {
    "name": "Read", "description": "Reads a file from the local filesystem.",
    "parameters": {"type": "object", "properties": {"file_path": {"type": "string"},
                                                    "offset": {"type": "number"}, "limit": {"type": "number"}},
                   "required": ["file_path"], "additionalProperties": False,
                   "$schema": "http://json-schema.org/draft-07/schema#"}}}
WORKFLOW = {"type": "function", "function": {
    "name": "Workflow", "description": "Runs a workflow script.",
    "parameters": {"type": "object", "properties": {
        "script": {"type": "string", "maxLength": 524288, "description": "The workflow script"},
        "description": {"type": "string"}},
        "required": ["script"], "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}}}
SEND_MESSAGE = {"type": "function", "function": {
    "name": "SendMessage", "description": "Sends a message to a teammate.",
    "parameters": {"type": "object", "properties": {
        "to": {"type": "string", "description": "Recipient: a name, or name@team",
               "allOf": [{"pattern": "^[a-zA-Z0-9_-]+(@[a-zA-Z0-9_-]+)?$"}, {"pattern": "^.{1,64}$"}]},
        "message": {"type": "string", "maxLength": 200}},
        "required": ["to", "message"], "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#"}}}
ORDINARY = dict(model="x", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)


class Rating(BaseModel):
    """What pydantic writes for ge/le and max_length, strict through the SDK's helpers."""
    stars: int = Field(ge=1, le=5)
    score: float = Field(ge=0, le=1)
    comment: str = Field(max_length=60)


@pytest.fixture
def held(monkeypatch):
    """Holds the first grammar rule written (the first request's preparation) until released."""
    real = converter.Grammar.write
    state = SimpleNamespace(reached=threading.Event(), release=threading.Event(), events=[])

    def write(self, *args, **kwargs):
        if not state.reached.is_set():
            state.events.append("preparing")
            state.reached.set()
            assert state.release.wait(120)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(converter.Grammar, "write", write)
    yield state
    state.release.set()


def beside(live, held, first):
    """Runs ``first()`` while a second client's ordinary request is served; /health must answer
    while the first is held in its preparation. Returns both results (an exception as it is)."""
    out: dict[str, object] = {}

    def run(key, fn):
        try:
            out[key] = fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out[key] = e

    second_client = openai_client(live)
    a = threading.Thread(target=run, args=("first", first))
    a.start()
    while not held.reached.wait(0.05):
        assert a.is_alive(), f"the first request never reached its grammar: {out.get('first')!r}"
    health = httpx.get(live.url.removesuffix("/v1") + "/health", timeout=30)
    assert health.status_code == 200
    held.events.append("health")
    b = threading.Thread(target=run, args=("second", lambda: second_client.chat.completions.create(**ORDINARY)))
    b.start()
    held.events.append("released")
    held.release.set()
    a.join(300)
    b.join(300)
    assert held.events == ["preparing", "health", "released"]
    second = out["second"]
    assert not isinstance(second, Exception), second
    assert second.choices[0].message.content is not None
    return out["first"]


def check_calls(message, tools):
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in message.tool_calls or []:
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])


def named(name):
    return {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize("tools, ask, choice", [
    # Claude Code's Workflow tool beside ordinary tools
    ([READ, WEATHER, WORKFLOW], "Run a workflow that lists the files here.", "auto"),
    ([READ, WEATHER, WORKFLOW], "Run a workflow that lists the files here.", "required"),
    ([READ, WEATHER, WORKFLOW], "Run a workflow that lists the files here.", named("Workflow")),
    # zod's allOf of two patterns in SendMessage
    ([READ, SEND_MESSAGE], "Tell ann@backend that the build is green.", "auto"),
    ([READ, SEND_MESSAGE], "Tell ann@backend that the build is green.", named("SendMessage")),
], ids=["workflow-auto", "workflow-required", "workflow-named", "send-message-auto", "send-message-named"])
def test_claude_codes_tools_through_chat_completions(live, held, tools, ask, choice):
    client = openai_client(live)
    resp = beside(live, held, lambda: client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": ask}], tools=tools, tool_choice=choice, max_tokens=80,
        temperature=0))
    assert not isinstance(resp, Exception), resp
    out = resp.choices[0]
    if choice != "auto":
        assert out.finish_reason in ("tool_calls", "length") and out.message.tool_calls
    if out.finish_reason == "tool_calls":
        check_calls(out.message, tools)


@pytest.mark.parametrize("choice", [{"type": "auto"}, {"type": "tool", "name": "Workflow"}])
def test_claude_code_through_the_messages_api(live, held, choice):
    """As Claude Code sends it: /v1/messages, input_schema, tool_choice auto or the tool."""
    claude = anthropic_client(live)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in (READ, WORKFLOW, SEND_MESSAGE)]
    msg = beside(live, held, lambda: claude.messages.create(
        model="x", max_tokens=60, tools=tools, tool_choice=choice,
        messages=[{"role": "user", "content": "Run a workflow that lists the files here."}], extra_body={"temperature": 0}))
    assert not isinstance(msg, Exception), msg
    schemas = {t["name"]: t["input_schema"] for t in tools}
    for block in msg.content:
        if block.type == "tool_use" and msg.stop_reason == "tool_use":
            jsonschema.validate(block.input, schemas[block.name])
    if choice["type"] == "tool":
        assert any(b.type == "tool_use" for b in msg.content) or msg.stop_reason == "max_tokens"


def test_pydantic_ge_le_through_the_sdks_parse(live, held):
    client = openai_client(live)
    resp = beside(live, held, lambda: client.chat.completions.parse(
        model="x", messages=[{"role": "user", "content": "Rate the movie Alien."}], response_format=Rating,
        max_tokens=80, temperature=0.7, seed=3))
    assert not isinstance(resp, Exception), resp
    parsed = resp.choices[0].message.parsed
    assert isinstance(parsed, Rating) and 1 <= parsed.stars <= 5 and 0 <= parsed.score <= 1


@pytest.mark.parametrize("choice", ["required", named("Rating")])
def test_pydantic_ge_le_through_pydantic_function_tool(live, held, choice):
    tool = openai.pydantic_function_tool(Rating)
    assert tool["function"]["strict"] is True
    assert tool["function"]["parameters"]["properties"]["stars"] == {"maximum": 5, "minimum": 1, "title": "Stars",
                                                                     "type": "integer"}
    client = openai_client(live)
    resp = beside(live, held, lambda: client.chat.completions.parse(
        model="x", messages=[{"role": "user", "content": "Rate the movie Alien."}], tools=[tool], tool_choice=choice,
        max_tokens=80, temperature=0.7, seed=5))
    assert not isinstance(resp, Exception), resp
    out = resp.choices[0]
    assert out.finish_reason in ("tool_calls", "length")
    if out.finish_reason == "tool_calls":
        args = out.message.tool_calls[0].function.parsed_arguments
        assert isinstance(args, Rating) and 1 <= args.stars <= 5 and 0 <= args.score <= 1


@pytest.mark.parametrize("strict", [True, False])
def test_hostile_schemas_are_answered_and_the_server_stays_up(live, strict):
    """Each is a 400 naming where (strict, or a schema too large to check) or an answer under a
    grammar within the limits; the process serves on."""
    base = live.url.removesuffix("/v1")
    for name, schema in HOSTILE.items():
        r = httpx.post(f"{live.url}/chat/completions", timeout=120, json={
            **ORDINARY, "max_tokens": 4, "response_format": {
                "type": "json_schema", "json_schema": {"name": "h", "schema": schema, "strict": strict}}})
        assert r.status_code in (200, 400), (name, r.status_code, r.text[:300])
        if r.status_code == 400:
            assert r.json()["error"]["param"].startswith("response_format.json_schema.schema"), (name, r.text[:300])
            assert strict or name == "too many subschemas", (name, r.text[:300])
        assert httpx.get(f"{base}/health", timeout=30).status_code == 200, name
