"""Helpers of the Responses API tests: every body and every stream event is validated against
OpenAI's spec, and streams are read raw, so an SDK's leniency hides nothing."""

from __future__ import annotations

import json
import time

import httpx

from support.spec import assert_valid


def create(client, **kw):
    """responses.create through the SDK; the raw body is validated against the spec first."""
    raw = client.responses.with_raw_response.create(**{"model": "gpt-4o", "temperature": 0, **kw})
    body = raw.http_response.json()
    assert_valid("Response", body)
    return raw.parse(), body


def parse_events(raw: str) -> list[dict]:
    """The events of a Responses stream, read raw: every block has an event: line naming the
    type its data: carries, every payload validates as a ResponseStreamEvent (OpenAI's and Open
    Responses'), and the stream ends with the literal ``data: [DONE]`` that Open Responses requires."""
    events = []
    done = False
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        assert not done, "data after [DONE]"
        names = [line[6:].strip() for line in lines if line.startswith("event:")]
        data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        if data == "[DONE]":
            assert not names, "[DONE] is a bare data: line"
            done = True
            continue
        event = json.loads(data)
        assert names == [event["type"]], (names, event["type"])
        assert_valid("ResponseStreamEvent", event)
        events.append(event)
    assert done, "the stream did not end with data: [DONE]"
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
    return events


def stream_raw(server, body: dict, *, headers=None) -> list[dict]:
    r = httpx.post(f"{server.url}/responses", json={"model": "x", "temperature": 0, "stream": True, **body},
                   headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return parse_events(r.text)


def poll(client, response_id, until, tries=600):
    """GETs the response until ``until(body)`` holds; progress is asserted, never a duration."""
    for _ in range(tries):
        body = client.responses.with_raw_response.retrieve(response_id).http_response.json()
        assert_valid("Response", body)
        if until(body):
            return body
        time.sleep(0.05)
    raise AssertionError(f"response {response_id} never reached the state waited for")
