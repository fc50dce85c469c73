"""Realtime client secrets (``POST /v1/realtime/client_secrets``), driven by openai-python: made
with the key, they open the Realtime socket (bearer or browser subprotocol) and nothing else,
each session starting from the configuration given with the secret, until the secret expires.
Bodies and events are validated against the spec's schemas."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import websockets.exceptions
import websockets.sync.client
from support.spec import assert_valid
from test_realtime import KEY, MODEL, Events, check, client, ws_url

from openai_ext.realtime import secrets as secrets_mod

SESSION = {"type": "realtime", "instructions": "Answer like a pirate.", "output_modalities": ["text"],
           "max_output_tokens": 32, "audio": {"output": {"speed": 1.25}}}


@pytest.fixture(scope="module")
def rt(scripted_host, make_server):
    return make_server(scripted_host, api_key=KEY, realtime_max_sessions=2)


def make(server, **body):
    """A secret made through the SDK: the parsed one, and the body as sent (validated)."""
    response = client(server).realtime.client_secrets.with_raw_response.create(**body)
    raw = response.http_response.json()
    assert_valid("RealtimeCreateClientSecretResponse", raw)
    return response.parse(), raw


def test_a_secret_opens_a_session_that_starts_from_its_configuration(rt):
    made, raw = make(rt, expires_after={"anchor": "created_at", "seconds": 120}, session={**SESSION, "model": MODEL})
    assert made.value.startswith("ek_") and raw["session"]["instructions"] == SESSION["instructions"]
    assert raw["session"]["model"] == MODEL and raw["session"]["output_modalities"] == ["text"]
    assert made.expires_at == pytest.approx(time.time() + 120, abs=60)
    # the client app holds only the secret; the model comes from it too
    app = openai.OpenAI(base_url=rt.url, api_key=made.value, max_retries=0)
    with app.realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        session = events.next()["session"]
        assert session["instructions"] == SESSION["instructions"] and session["output_modalities"] == ["text"]
        assert session["max_output_tokens"] == 32 and session["audio"]["output"]["speed"] == 1.25
        # and it may change it as any session does
        connection.session.update(session={"type": "realtime", "instructions": "Be brief."})
        updated = events.next()
        assert updated["type"] == "session.updated" and updated["session"]["instructions"] == "Be brief."
        assert updated["session"]["output_modalities"] == ["text"]
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello?"}]})
        events.until("conversation.item.done")
        connection.response.create()
        done = events.until("response.done")[-1]["response"]
        assert done["status"] in ("completed", "incomplete") and done["output"][0]["content"][0]["type"] == "output_text"
    # a second session from the same secret starts from its configuration again, not the first's
    with app.realtime.connect(model=MODEL) as connection:
        assert Events(connection).next()["session"]["instructions"] == SESSION["instructions"]


def test_a_browser_offers_the_secret_as_its_subprotocol(rt):
    made, _ = make(rt)
    with websockets.sync.client.connect(ws_url(rt), subprotocols=["realtime", f"openai-insecure-api-key.{made.value}"]) as ws:
        assert ws.subprotocol == "realtime"
        created = json.loads(ws.recv())
        assert created["type"] == "session.created" and created["session"]["instructions"] == ""


def test_a_secret_opens_nothing_but_the_realtime_socket(rt):
    made, _ = make(rt)
    for path in ("/models", "/realtime/client_secrets"):
        r = httpx.request("GET" if path == "/models" else "POST", rt.url + path, json={},
                          headers={"Authorization": f"Bearer {made.value}"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
    # nor does a secret no one made, or a secret without a key make one
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(ws_url(rt), additional_headers={"Authorization": "Bearer ek_" + "0" * 32})
    assert refused.value.response.status_code == 401
    r = httpx.post(rt.url + "/realtime/client_secrets", json={})
    assert r.status_code == 401


def test_an_expired_secret_is_refused(rt, monkeypatch):
    made, _ = make(rt, expires_after={"seconds": 10})
    secrets = rt.app.state.api.realtime.secrets
    monkeypatch.setattr(secrets, "clock", lambda: made.expires_at)      # its last second has passed
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(ws_url(rt), additional_headers={"Authorization": f"Bearer {made.value}"})
    assert refused.value.response.status_code == 401
    monkeypatch.setattr(secrets, "clock", lambda: made.expires_at - 1)  # (a second before, it was alive)
    assert secrets.find([made.value]) is None                           # but it was let go when found expired


def test_a_secret_that_expires_as_its_socket_opens_still_gives_the_session_its_start(rt, monkeypatch):
    # The guard lets the socket in by the secret while it lives; the session then starts from the
    # secret the guard found, not from a second lookup that may come a moment after it expired
    # (which would start a session let in by the secret from the default configuration).
    made, _ = make(rt, session={**SESSION, "model": MODEL})
    secrets = rt.app.state.api.realtime.secrets
    lookups = []

    def clock() -> float:
        lookups.append(None)
        return made.expires_at - 1 if len(lookups) == 1 else made.expires_at   # alive for the first look only

    monkeypatch.setattr(secrets, "clock", clock)
    with websockets.sync.client.connect(ws_url(rt), additional_headers={"Authorization": f"Bearer {made.value}"}) as ws:
        created = check(json.loads(ws.recv()))
    assert created["type"] == "session.created" and created["session"]["instructions"] == SESSION["instructions"]
    assert len(lookups) == 1


@pytest.mark.parametrize("body, param", [
    ({"expires_after": {"seconds": 5}}, "expires_after.seconds"),
    ({"expires_after": {"seconds": 7201}}, "expires_after.seconds"),
    ({"expires_after": {"seconds": "600"}}, "expires_after.seconds"),
    ({"expires_after": {"anchor": "now"}}, "expires_after.anchor"),
    ({"expires_after": {"secs": 60}}, "expires_after.secs"),
    ({"expires_after": 60}, "expires_after"),
    ({"session": {"type": "transcription"}}, "session.type"),
    ({"session": {"type": "realtime", "instructionz": "x"}}, "session.instructionz"),
    ({"session": {"type": "realtime", "audio": {"output": {"speed": 9}}}}, "session.audio.output.speed"),
    ({"session": {"type": "realtime", "output_modalities": ["video"]}}, "session.output_modalities"),
    ({"session": "realtime"}, "session"),
    ({"sesion": {}}, "sesion"),
])
def test_a_bad_request_is_refused_naming_the_field(rt, body, param):
    r = httpx.post(rt.url + "/realtime/client_secrets", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    with pytest.raises(openai.BadRequestError):
        client(rt).post("/realtime/client_secrets", body=body, cast_to=object)


def test_live_secrets_are_bounded(rt, monkeypatch):
    secrets = rt.app.state.api.realtime.secrets
    monkeypatch.setattr(secrets_mod, "MAX_LIVE", len(secrets._live) + 1)
    make(rt)
    with pytest.raises(openai.RateLimitError) as refused:
        client(rt).realtime.client_secrets.create()
    assert refused.value.body["code"] == "too_many_client_secrets"


def test_without_a_key_a_secret_still_gives_its_sessions_their_start(scripted_host, make_server):
    server = make_server(scripted_host)
    plain = openai.OpenAI(base_url=server.url, api_key="anything", max_retries=0)
    made = plain.realtime.client_secrets.create(session={"type": "realtime", "instructions": "Be kind."})
    with openai.OpenAI(base_url=server.url, api_key=made.value, max_retries=0).realtime.connect(model=MODEL) as c:
        assert Events(c).next()["session"]["instructions"] == "Be kind."
    with plain.realtime.connect(model=MODEL) as c:      # another key: a session as any other
        assert Events(c).next()["session"]["instructions"] == ""
