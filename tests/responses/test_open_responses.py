"""Open Responses (openresponses.org, release 2026-04-24) where it asks more than OpenAI's spec: every body and
event of the Responses tests is validated against both specs (support/spec.py), and these tests pin the rules
its text adds: the sampler fields of its request and response objects, ``usage`` in every snapshot, ``[DONE]``
at the end of a stream, the WebSocket's codes, its connection-local state for ``store: false`` chains and the
connection's lifetime, and a required ``model`` for ``/responses/compact``."""

from __future__ import annotations

import asyncio
import gc
import json
import threading

import httpx
import pytest
import websockets
from support.responses_api import create, stream_raw
from support.scripted import Reply
from support.servers import wait_until
from support.spec import assert_valid, error_of

from openai_ext.responses import render

ENDS = ("response.completed", "response.incomplete", "response.failed", "error")


async def turn(connection, **fields) -> list[dict]:
    """One response.create on a socket, and its events up to its end, each validated against both specs."""
    await connection.send(json.dumps({"type": "response.create", "model": "gpt-4o", "temperature": 0,
                                      "max_output_tokens": 16, **fields}))
    out = []
    while not out or out[-1]["type"] not in ENDS:
        event = json.loads(await connection.recv())
        assert_valid("ResponsesServerEvent", event)
        out.append(event)
    return out


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/responses"


def test_the_penalties_are_taken_reach_the_sampler_and_are_echoed(srserver, srclient, script):
    """Open Responses' request body has presence_penalty and frequency_penalty (OpenAI's has not): they are taken
    with chat's ranges, reach the host's sampler, and the Response object always carries both."""
    _, body = create(srclient, input="Hi", max_output_tokens=16,
                     extra_body={"presence_penalty": 0.5, "frequency_penalty": -0.25})
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.5, -0.25)
    settings = script.calls[-1].settings
    assert (settings.presence_penalty, settings.frequency_penalty) == (0.5, -0.25)
    _, plain = create(srclient, input="Hi", max_output_tokens=16)
    assert (plain["presence_penalty"], plain["frequency_penalty"]) == (0.0, 0.0)
    out_of_range = httpx.post(f"{srserver.url}/responses", json={"model": "x", "input": "Hi", "presence_penalty": 3})
    assert error_of(out_of_range, 400)["param"] == "presence_penalty"


def test_every_snapshot_carries_usage_and_the_stream_ends_with_done(srserver, script):
    """response.created and response.in_progress carry usage (null until the end): Open Responses requires the
    key; and the stream's last line is data: [DONE] (parse_events asserts it)."""
    events = stream_raw(srserver, {"input": "Hi", "max_output_tokens": 16})
    created, progress = events[0], events[1]
    assert (created["type"], progress["type"]) == ("response.created", "response.in_progress")
    assert created["response"]["usage"] is None and progress["response"]["usage"] is None
    assert events[-1]["response"]["usage"]["output_tokens"] > 0


def test_a_response_stored_before_these_fields_reads_back_valid(srserver, srclient, script):
    """A body stored by an earlier release (without the fields Open Responses added) is read back with them."""
    _, body = create(srclient, input="Hi", max_output_tokens=16)
    store = srserver.app.state.api.responses.store
    old = {k: v for k, v in body.items() if k not in render.GAINED}

    def rewrite(conn):
        conn.execute("UPDATE responses SET body = ? WHERE id = ?", (json.dumps(old), body["id"]))
    store._run(rewrite, write=True)
    again = srclient.responses.with_raw_response.retrieve(body["id"]).http_response.json()
    assert_valid("Response", again)
    assert again["presence_penalty"] == 0.0 and again["id"] == body["id"]


def test_compact_needs_a_model(srserver, script):
    r = httpx.post(f"{srserver.url}/responses/compact", json={"input": "Summarise this."})
    error = error_of(r, 400)
    assert error["param"] == "model"


def test_a_malformed_conversation_id_says_what_one_looks_like(srserver, srclient, script):
    r = httpx.post(f"{srserver.url}/responses", json={"model": "x", "input": "Hi", "conversation": "abc"})
    error = error_of(r, 400)
    assert error["param"] == "conversation" and "conv_" in error["message"]


def test_a_missing_previous_response_has_its_code_over_http_too(srserver, script):
    r = httpx.post(f"{srserver.url}/responses", json={"model": "x", "input": "Hi",
                                                       "previous_response_id": "resp_missing"})
    error = error_of(r, 404)
    assert (error["code"], error["param"]) == ("previous_response_not_found", "previous_response_id")


def test_every_websocket_error_has_a_code(srserver, script):
    """Open Responses: a WebSocket error MUST carry error.code, and previous_response_not_found for a missing
    previous response (asserted valid against its WebSocketErrorEvent, which requires the code)."""
    async def go():
        async with websockets.connect(ws_url(srserver)) as ws:
            [bad] = await turn(ws, max_output_tokens=3, input="Hi")
            [missing] = await turn(ws, input="Hi", previous_response_id="resp_nowhere")
            await ws.send("not json")
            not_json = json.loads(await ws.recv())
            assert_valid("ResponsesServerEvent", not_json)
            return bad, missing, not_json

    bad, missing, not_json = asyncio.run(go())
    assert bad["status"] == 400 and bad["error"]["code"] and bad["error"]["param"] == "max_output_tokens"
    assert missing["error"]["code"] == "previous_response_not_found"
    assert missing["error"]["param"] == "previous_response_id"
    assert not_json["error"]["code"]


def test_a_store_false_chain_continues_on_its_socket_only(srserver, script):
    """With store: false nothing is stored, yet a continuation on the same socket sees the earlier turn (from the
    connection's own memory); on another socket, or over HTTP, the id is not found."""
    script.script("The code word is cobalt.", "OK")

    async def go():
        async with websockets.connect(ws_url(srserver)) as ws:
            first = await turn(ws, store=False, input="Remember the code word: cobalt.")
            rid = first[-1]["response"]["id"]
            second = await turn(ws, store=False, previous_response_id=rid, input="What was it?")
        async with websockets.connect(ws_url(srserver)) as other:
            [elsewhere] = await turn(other, store=False, previous_response_id=rid, input="What was it?")
        return rid, second, elsewhere

    rid, second, elsewhere = asyncio.run(go())
    final = second[-1]["response"]
    assert final["status"] in ("completed", "incomplete") and final["previous_response_id"] == rid
    prompt = script.calls[-1].prompt.text
    assert "Remember the code word: cobalt." in prompt and "The code word is cobalt." in prompt
    assert elsewhere["error"]["code"] == "previous_response_not_found"
    r = httpx.post(f"{srserver.url}/responses", json={"model": "x", "input": "Hi", "previous_response_id": rid})
    assert error_of(r, 404)["code"] == "previous_response_not_found"


def test_a_failed_continuation_evicts_the_response_it_named(srserver, script):
    """Open Responses: a continuation that fails with a 4xx or 5xx evicts the response it named from the
    connection's memory, and a later continuation of that store: false response is previous_response_not_found."""
    script.script("The code word is ember.")

    async def go():
        async with websockets.connect(ws_url(srserver)) as ws:
            first = await turn(ws, store=False, input="Remember the code word: ember.")
            rid = first[-1]["response"]["id"]
            [failed] = await turn(ws, store=False, previous_response_id=rid, input="Go on.", max_output_tokens=3)
            [after] = await turn(ws, store=False, previous_response_id=rid, input="Go on.")
        return failed, after

    failed, after = asyncio.run(go())
    assert failed["status"] == 400
    assert after["error"]["code"] == "previous_response_not_found"


def test_a_server_that_stores_nothing_still_chains_on_a_socket(scripted_host, script, make_server, tmp_path):
    """With the store off, a socket's own chain still works; a response it does not hold is
    previous_response_not_found, as Open Responses has it."""
    server = make_server(scripted_host, data_dir=str(tmp_path), responses_store=False)
    script.script("Noted: copper.", "copper")

    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            first = await turn(ws, store=False, input="Remember: copper.")
            second = await turn(ws, store=False, previous_response_id=first[-1]["response"]["id"],
                                input="What was it?")
            [unknown] = await turn(ws, input="Hi", previous_response_id="resp_unknown")
        return second, unknown

    second, unknown = asyncio.run(go())
    assert second[-1]["type"] in ("response.completed", "response.incomplete")
    assert "Noted: copper." in script.calls[-1].prompt.text
    assert unknown["error"]["code"] == "previous_response_not_found"


def test_a_connection_ends_at_its_lifetime_after_its_work(scripted_host, script, make_server, tmp_path):
    """At the end of websocket_lifetime the response in flight still finishes; then the connection gets the
    error websocket_connection_limit_reached and is closed with a normal close."""
    server = make_server(scripted_host, data_dir=str(tmp_path), websocket_lifetime=0.2)
    gate = threading.Event()
    script.script(Reply("A short answer.", gate=gate, gate_at=1))

    async def go():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": "x", "input": "Hi",
                                      "max_output_tokens": 16}))
            events = []
            while True:
                try:
                    event = json.loads(await ws.recv())
                except websockets.ConnectionClosed as closed:
                    return events, closed.rcvd.code if closed.rcvd else None
                assert_valid("ResponsesServerEvent", event)
                events.append(event)
                if event["type"] == "response.in_progress":
                    # the generation is held until the connection's lifetime is over
                    await asyncio.to_thread(wait_until, lambda: _expired(server), "the lifetime to end")
                    gate.set()

    events, code = asyncio.run(go())
    kinds = [e["type"] for e in events]
    assert "response.completed" in kinds and kinds.index("response.completed") < len(kinds) - 1
    assert kinds[-1] == "error" and events[-1]["error"]["code"] == "websocket_connection_limit_reached"
    assert code == 1000


def _expired(server) -> bool:
    """Whether a Responses socket of ``server`` has passed its lifetime (the connection objects are
    found through the garbage collector: the server keeps no list of them). By type, not
    isinstance: isinstance asks some objects for their class, and a deprecated module attribute
    (torch's) then warns."""
    from openai_ext.responses.websocket import _Connection
    service = server.app.state.api.responses
    return any(type(o) is _Connection and o.service is service and o.expired for o in gc.get_objects())


@pytest.mark.parametrize("phase", ["commentary", "final_answer"])
def test_assistant_phases_are_taken(srclient, script, phase):
    """Open Responses' optional assistant-message phase is accepted in input (its compliance suite sends it)."""
    _, body = create(srclient, input=[{"type": "message", "role": "assistant", "phase": phase,
                                       "content": "The number is four."},
                                      {"type": "message", "role": "user", "content": "Repeat only the number."}],
                     max_output_tokens=16)
    assert body["status"] in ("completed", "incomplete")


def test_every_output_item_has_an_id_a_type_and_a_status(srserver, script):
    """Open Responses: every item MUST carry id, type and status, the compaction item included (its schema has no
    status; its prose requires one, and both specs let it through)."""
    script.script("A summary of the talk.")
    compacted = httpx.post(f"{srserver.url}/responses/compact", timeout=60,
                           json={"model": "x", "input": [{"role": "user", "content": "Hello there."},
                                                         {"role": "assistant", "content": "Hi! How can I help?"}]})
    assert compacted.status_code == 200, compacted.text
    body = compacted.json()
    assert_valid("CompactResource", body)
    events = stream_raw(srserver, {"input": "Hi", "max_output_tokens": 16})
    outputs = body["output"] + events[-1]["response"]["output"]
    assert any(it["type"] == "compaction" for it in outputs)
    for it in outputs:
        assert it.get("id") and it.get("type") and it.get("status") in ("in_progress", "completed", "incomplete"), it
