"""Background responses: answered at once, polled, followed as a stream and replayed, cancelled."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.responses_api import create, parse_events, poll
from support.scripted import held
from support.spec import assert_valid, error_of


def test_a_background_response_is_answered_at_once_then_runs(srclient):
    resp, body = create(srclient, input="Say hi.", max_output_tokens=20, background=True)
    assert body["status"] == "queued" and body["background"] is True and body["output"] == []
    final = poll(srclient, resp.id, lambda b: b["status"] not in ("queued", "in_progress"))
    assert final["status"] in ("completed", "incomplete") and final["output"][0]["content"][0]["text"]
    assert final["usage"]["output_tokens"] <= 20


def test_cancel_stops_a_running_background_response(srclient, srserver, script):
    [reply] = script.script(held())   # a long reply, still running until the request ends
    resp, _ = create(srclient, input="Write a very long story about a dragon.", max_output_tokens=1500,
                     background=True)
    poll(srclient, resp.id, lambda b: b["status"] == "in_progress")
    assert reply.started.wait(60)   # it is generating now
    cancelled = srclient.responses.with_raw_response.cancel(resp.id).http_response.json()
    assert_valid("Response", cancelled)
    assert cancelled["status"] == "cancelled"
    stored = poll(srclient, resp.id, lambda b: True)
    assert stored["status"] == "cancelled"
    health = httpx.get(srserver.url.removesuffix("/v1") + "/health").json()
    assert health["running"] == 0
    # cancelling again changes nothing; a response that was not in the background cannot be
    assert srclient.responses.cancel(resp.id).status == "cancelled"
    plain, _ = create(srclient, input="Say hi.", max_output_tokens=16)
    with pytest.raises(openai.BadRequestError) as e:
        srclient.responses.cancel(plain.id)
    assert e.value.body["message"] == "Cannot cancel a synchronous response."   # OpenAI's words


def test_a_background_stream_can_be_followed_and_replayed(srserver, srclient):
    r = httpx.post(f"{srserver.url}/responses", timeout=120, json={
        "model": "x", "input": "Say hi.", "max_output_tokens": 100, "temperature": 0,
        "background": True, "stream": True})
    events = parse_events(r.text)
    types = [e["type"] for e in events]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert events[0]["response"]["status"] == "queued" and events[2]["response"]["status"] == "in_progress"
    assert types[-1] == "response.completed"
    response_id = events[0]["response"]["id"]
    poll(srclient, response_id, lambda b: b["status"] not in ("queued", "in_progress"))
    # GET ?stream=true replays what came after a sequence number, as it was sent
    again = httpx.get(f"{srserver.url}/responses/{response_id}", params={"stream": "true", "starting_after": 3},
                      timeout=60)
    assert parse_events(again.text) == events[4:]
    # the SDK's own resume helper
    with srclient.responses.stream(response_id=response_id, starting_after=0) as s:
        replayed = [e.type for e in s]
        final = s.get_final_response()
    assert replayed == types[1:] and final.id == response_id


def test_background_needs_storage(srclient, srserver):
    with pytest.raises(openai.BadRequestError) as e:
        create(srclient, input="Hi", background=True, store=False, max_output_tokens=16)
    assert e.value.body["param"] == "background"
    plain, _ = create(srclient, input="Hi", max_output_tokens=16)
    err = error_of(httpx.get(f"{srserver.url}/responses/{plain.id}", params={"stream": "true"}), 400)
    assert err["param"] == "stream"
