"""Streamed responses: OpenAI's semantic events, read raw and through the SDK's stream helper;
a client that leaves stops its generation; a failure after the start ends the stream with an
error event and response.failed."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from support.hosts import FailingHost
from support.responses_api import parse_events, stream_raw
from support.scripted import held
from support.servers import openai_client, wait_until
from support.spec import assert_valid

Q = "Name three colours of the rainbow."


def kinds(events):
    return [e["type"] for e in events]


def test_a_text_stream_has_every_event_in_order(srserver, srclient):
    events = stream_raw(srserver, {"input": Q, "max_output_tokens": 24})
    types = kinds(events)
    assert events[0]["sequence_number"] == 0
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and types[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert types[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", events[-1]["type"]]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    created, final = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    text = "".join(d["delta"] for d in deltas)
    item_id = events[2]["item"]["id"]
    assert all(e["item_id"] == item_id for e in events if "item_id" in e)
    assert events[-4]["text"] == text == final["output"][0]["content"][0]["text"]
    assert events[-2]["item"] == final["output"][0]
    assert final["usage"]["output_tokens"] <= 24
    # the stored response is the one the stream ended with
    stored = srclient.responses.with_raw_response.retrieve(final["id"]).http_response.json()
    assert_valid("Response", stored)
    assert stored == final


def test_the_sdk_stream_helper_accumulates(srclient):
    with srclient.responses.stream(model="gpt-4o", input="Say hi.", temperature=0, max_output_tokens=40) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.status in ("completed", "incomplete")
    assert final.output_text == "".join(deltas) != ""


def test_logprobs_ride_on_the_deltas(srserver):
    events = stream_raw(srserver, {"input": Q, "max_output_tokens": 16, "top_logprobs": 1,
                                  "include": ["message.output_text.logprobs"]})
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(lp["token"] for d in deltas for lp in d["logprobs"]) == "".join(d["delta"] for d in deltas)
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert len(done["logprobs"]) == events[-1]["response"]["usage"]["output_tokens"]


def test_a_client_that_leaves_stops_the_generation(srserver, srclient, script):
    script.script(held())   # a long reply, still running until the request ends
    body = {"model": "x", "input": "Write a very long story about a dragon.", "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{srserver.url}/responses", json=body, timeout=120) as r:
        response_id = None
        for line in r.iter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                response_id = event.get("response", {}).get("id", response_id)
                if event["type"] == "response.output_text.delta":
                    break
    health = srserver.url.removesuffix("/v1") + "/health"
    wait_until(lambda: httpx.get(health).json()["running"] == 0, "the generation stopped")
    stored = srclient.responses.retrieve(response_id)
    assert stored.status == "cancelled"
    # the line moved on: the next request is answered
    assert srclient.responses.create(model="x", input="Say hi.", max_output_tokens=16).status != "failed"


@pytest.fixture(scope="module")
def failing(scripted_host, make_server, tmp_path_factory):
    return make_server(FailingHost(scripted_host), data_dir=str(tmp_path_factory.mktemp("failing")))


def test_a_failure_after_the_start_ends_the_stream_with_an_error(failing):
    r = httpx.post(f"{failing.url}/responses", timeout=120,
                   json={"input": Q, "stream": True, "max_output_tokens": 40, "temperature": 0})
    events = parse_events(r.text)
    assert kinds(events)[-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "server_error" and "RuntimeError" in events[-2]["message"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert failed["output"][0]["content"][0]["text"]           # what was generated before the failure
    stored = httpx.get(f"{failing.url}/responses/{failed['id']}").json()
    assert stored["status"] == "failed"


def test_a_failure_without_stream_is_a_500_and_a_failed_response(failing):
    client = openai_client(failing)
    with pytest.raises(openai.InternalServerError) as e:
        client.responses.create(model="x", input=Q, max_output_tokens=40, temperature=0)
    assert_valid("ErrorResponse", e.value.response.json())


def test_a_client_that_leaves_a_plain_request_stops_it_too(srserver, script):
    script.script(held())   # a long reply, still running until the request ends
    health = srserver.url.removesuffix("/v1") + "/health"
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{srserver.url}/responses", timeout=httpx.Timeout(60, read=0.3),
                   json={"input": "Write a very long story about a dragon.", "temperature": 0})
    wait_until(lambda: httpx.get(health).json()["running"] == 0, "the generation stopped")
