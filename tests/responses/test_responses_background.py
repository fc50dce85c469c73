"""Background responses: answered at once, polled, followed as a stream and replayed, cancelled."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.responses_api import create, parse_events, poll
from support.spec import assert_valid, error_of


def test_a_background_response_is_answered_at_once_then_runs(rclient):
    resp, body = create(rclient, input="Say hi.", max_output_tokens=20, background=True)
    assert body["status"] == "queued" and body["background"] is True and body["output"] == []
    final = poll(rclient, resp.id, lambda b: b["status"] not in ("queued", "in_progress"))
    assert final["status"] in ("completed", "incomplete") and final["output"][0]["content"][0]["text"]
    assert final["usage"]["output_tokens"] <= 20


def test_cancel_stops_a_running_background_response(rclient, rserver):
    resp, _ = create(rclient, input="Write a very long story about a dragon.", max_output_tokens=1500,
                     background=True)
    poll(rclient, resp.id, lambda b: b["status"] == "in_progress")
    cancelled = rclient.responses.with_raw_response.cancel(resp.id).http_response.json()
    assert_valid("Response", cancelled)
    assert cancelled["status"] == "cancelled"
    stored = poll(rclient, resp.id, lambda b: True)
    assert stored["status"] == "cancelled"
    health = httpx.get(rserver.url.removesuffix("/v1") + "/health").json()
    assert health["running"] == 0
    # cancelling again changes nothing; a response that was not in the background cannot be
    assert rclient.responses.cancel(resp.id).status == "cancelled"
    plain, _ = create(rclient, input="Say hi.", max_output_tokens=16)
    with pytest.raises(openai.BadRequestError) as e:
        rclient.responses.cancel(plain.id)
    assert e.value.body["message"] == "Cannot cancel a synchronous response."   # OpenAI's words


def test_a_background_stream_can_be_followed_and_replayed(rserver, rclient):
    r = httpx.post(f"{rserver.url}/responses", timeout=120, json={
        "model": "x", "input": "Say hi.", "max_output_tokens": 100, "temperature": 0,
        "background": True, "stream": True})
    events = parse_events(r.text)
    types = [e["type"] for e in events]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert events[0]["response"]["status"] == "queued" and events[2]["response"]["status"] == "in_progress"
    assert types[-1] == "response.completed"
    response_id = events[0]["response"]["id"]
    poll(rclient, response_id, lambda b: b["status"] not in ("queued", "in_progress"))
    # GET ?stream=true replays what came after a sequence number, as it was sent
    again = httpx.get(f"{rserver.url}/responses/{response_id}", params={"stream": "true", "starting_after": 3},
                      timeout=60)
    assert parse_events(again.text) == events[4:]
    # the SDK's own resume helper
    with rclient.responses.stream(response_id=response_id, starting_after=0) as s:
        replayed = [e.type for e in s]
        final = s.get_final_response()
    assert replayed == types[1:] and final.id == response_id


def test_background_needs_storage(rclient, rserver):
    with pytest.raises(openai.BadRequestError) as e:
        create(rclient, input="Hi", background=True, store=False, max_output_tokens=16)
    assert e.value.body["param"] == "background"
    plain, _ = create(rclient, input="Hi", max_output_tokens=16)
    err = error_of(httpx.get(f"{rserver.url}/responses/{plain.id}", params={"stream": "true"}), 400)
    assert err["param"] == "stream"
