"""The Realtime API over a real WebSocket, driven by openai-python's realtime client
(``client.realtime.connect``): text turns, spoken turns (piper speech in, Whisper, the model,
piper speech out), tools, bad events and the guards. Every server event is validated against
the spec's schema for its type (the members of the RealtimeServerEvent union)."""

from __future__ import annotations

import base64
import functools
import json
import threading
import time

import numpy as np
import openai
import pytest
import websockets.exceptions
import websockets.sync.client
from support.scripted import forced, held
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
def rt(scripted_host, make_server):
    return make_server(scripted_host, api_key=KEY, realtime_max_frame_kb=256, realtime_max_sessions=2)


def client(server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0)


class Events:
    """The raw events of a connection, each validated as it comes."""

    def __init__(self, connection):
        self.connection = connection
        self.seen: list[dict] = []

    def next(self, timeout: float = 120.0) -> dict:
        # a watchdog, not a timing: an event that never comes fails the test instead of hanging it
        watchdog = threading.Timer(timeout, self.connection.close)
        watchdog.start()
        try:
            raw = self.connection.recv_bytes()
        finally:
            watchdog.cancel()
        event = check(json.loads(raw))
        self.seen.append(event)
        return event

    def until(self, *types: str) -> list[dict]:
        out = []
        while True:
            event = self.next()
            out.append(event)
            if event["type"] in types:
                return out
            assert event["type"] != "error", f"waiting for {types}: {event['error']}"


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


# --- speech -----------------------------------------------------------------------------------

QUESTION = "What is the capital of France?"
CHUNK = 24_000 * 2 // 2          # half a second of 24 kHz PCM16 per append


@pytest.fixture(scope="module")
def say():
    """24 kHz PCM16 speech of a text, by the piper voice the server speaks with."""
    from openai_ext.audio.speech import render
    from openai_ext.audio.tts import load_engine
    from openai_ext.core.config import Settings

    tts = load_engine(Settings())

    @functools.cache
    def speak(text: str) -> bytes:
        return render(tts, text, tts.default_voice, fmt="pcm")
    return speak


def silence(seconds: float) -> bytes:
    return bytes(int(24_000 * seconds) * 2)


def append(connection, pcm: bytes) -> None:
    for at in range(0, len(pcm), CHUNK):
        connection.input_audio_buffer.append(audio=base64.b64encode(pcm[at:at + CHUNK]).decode())


def pcm_of(events: list[dict]) -> np.ndarray:
    data = b"".join(base64.b64decode(e["delta"]) for e in of(events, "response.output_audio.delta"))
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768


@pytest.mark.engines
@pytest.mark.slow
def test_a_spoken_turn_push_to_talk(rt, say):
    """Speech in, committed by the client: its transcript, then the answer as audio with its
    transcript, in 24 kHz PCM16 deltas."""
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.session.update(session={"type": "realtime", "instructions": "Answer in one short sentence.",
                                           "max_output_tokens": 40,
                                           "audio": {"input": {"turn_detection": None}}})
        assert events.next()["session"]["audio"]["input"]["turn_detection"] is None
        append(connection, say(QUESTION))
        connection.input_audio_buffer.commit()
        committed = events.next()
        assert committed["type"] == "input_audio_buffer.committed"
        connection.response.create()
        out = events.until("response.done")
        heard = of(out, "conversation.item.input_audio_transcription.completed")[0]
        assert heard["item_id"] == committed["item_id"]
        assert "capital" in heard["transcript"].lower() and "france" in heard["transcript"].lower()
        pieces = of(out, "conversation.item.input_audio_transcription.delta")
        assert pieces and "".join(p["delta"] for p in pieces).strip() == heard["transcript"]
        types = [e["type"] for e in out]
        # the response starts after the transcript is known
        assert types.index("conversation.item.input_audio_transcription.completed") < \
            types.index("response.output_item.added")
        transcript = "".join(e["delta"] for e in of(out, "response.output_audio_transcript.delta"))
        assert transcript and of(out, "response.output_audio_transcript.done")[0]["transcript"] == transcript
        pcm = pcm_of(out)
        assert len(pcm) > 24_000 * 0.5 and float(np.sqrt(np.mean(pcm ** 2))) > 0.02
        assert of(out, "response.output_audio.done")
        final = out[-1]["response"]
        assert final["output"][0]["content"][0] == {"type": "output_audio", "transcript": transcript}
        assert final["usage"]["output_token_details"]["audio_tokens"] > 0


# --- tools ------------------------------------------------------------------------------------

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_a_tool_round_trip(rt, script):
    """The model calls a function (tool_choice required: the scripted host writes the call's
    arguments after the name the server has put in the prompt); its output goes back as a
    function_call_output item, and a new response.create continues the turn."""
    script.script(forced({"city": "Paris"}))
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER],
                                           "tool_choice": "required", "max_output_tokens": 64})
        assert events.next()["session"]["tools"][0]["name"] == "get_weather"
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text",
                                                               "text": "What is the weather in Paris?"}]})
        events.until("conversation.item.done")
        connection.response.create()
        out = events.until("response.done")
        done = of(out, "response.function_call_arguments.done")[0]
        assert done["name"] == "get_weather" and isinstance(json.loads(done["arguments"])["city"], str)
        deltas = of(out, "response.function_call_arguments.delta")
        assert json.loads("".join(d["delta"] for d in deltas)) == json.loads(done["arguments"])
        call = out[-1]["response"]["output"][0]
        assert call["type"] == "function_call" and call["call_id"] == done["call_id"]
        assert call["status"] == "completed"
        connection.conversation.item.create(item={"type": "function_call_output", "call_id": done["call_id"],
                                                  "output": json.dumps({"sky": "sunny", "celsius": 21})})
        events.until("conversation.item.done")
        connection.response.create(response={"tool_choice": "none", "max_output_tokens": 32})
        out = events.until("response.done")
        assert out[-1]["response"]["status"] in ("completed", "incomplete")
        assert of(out, "response.output_text.done")[0]["text"]


# --- bad events and the guards ------------------------------------------------------------------

def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/realtime?model=" + MODEL


def raw_events(ws, *types: str) -> list[dict]:
    out = []
    while True:
        event = check(json.loads(ws.recv()))
        out.append(event)
        if event["type"] in types:
            return out


def test_bad_events_get_error_events_and_the_session_goes_on(rt):
    with websockets.sync.client.connect(ws_url(rt), additional_headers={"Authorization": f"Bearer {KEY}"},
                                        max_size=None) as ws:
        raw_events(ws, "session.created")
        cases = [
            ({"type": "conversation.frobnicate", "event_id": "e1"}, "invalid_event_type", "e1"),
            ({"type": "input_audio_buffer.append", "audio": "%%% not base64", "event_id": "e2"}, "invalid_value",
             "e2"),
            ({"type": "input_audio_buffer.append", "audio": "A" * (256 * 1024), "event_id": "e3"}, "event_too_large",
             None),
            ({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["video"]},
              "event_id": "e4"}, "invalid_value", "e4"),
            ({"type": "input_audio_buffer.commit", "event_id": "e5"}, "input_audio_buffer_commit_empty", "e5"),
            ({"type": "response.cancel", "event_id": "e6"}, "response_cancel_not_active", "e6"),
            ({"type": "conversation.item.retrieve", "item_id": "item_nope", "event_id": "e7"}, "item_not_found",
             "e7"),
        ]
        for sent, code, event_id in cases:
            ws.send(json.dumps(sent))
            error = raw_events(ws, "error")[-1]["error"]
            assert error["code"] == code and error["event_id"] == event_id, (sent, error)
            assert error["type"] == "invalid_request_error" and error["message"]
        ws.send("not json at all")
        assert raw_events(ws, "error")[-1]["error"]["code"] == "invalid_json"
        # a misspelt field, at any level, is named with a hint (not ignored); fields OpenAI's session has
        # and this server does not serve are taken
        for session, param, hint in (({"instrutions": "x"}, "session.instrutions", "instructions"),
                                     ({"audio": {"output": {"voise": "alloy"}}}, "session.audio.output.voise",
                                      "voice")):
            ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", **session},
                                "event_id": "e8"}))
            error = raw_events(ws, "error")[-1]["error"]
            assert error["code"] == "unknown_parameter" and error["param"] == param, error
            assert f"Did you mean '{hint}'?" in error["message"] and error["event_id"] == "e8"
        # an event's own fields too (core.api_model: the same check as every request body's)
        ws.send(json.dumps({"type": "response.cancel", "response_idd": "resp_1", "event_id": "e9"}))
        error = raw_events(ws, "error")[-1]["error"]
        assert error["code"] == "unknown_parameter" and error["param"] == "response_idd", error
        assert "Did you mean 'response_id'?" in error["message"] and error["event_id"] == "e9"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "tracing": "auto",
                                                                  "include": [], "model": "gpt-realtime"}}))
        raw_events(ws, "session.updated")
        # still serving
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
        assert raw_events(ws, "session.updated")[-1]["session"]["instructions"] == "Be brief."


def test_hostile_frames_get_error_events_and_the_session_goes_on(rt):
    """A frame nested past the limit, or holding a number JSON has not, is an error event, as
    the same body over HTTP is a 400 (core/bodies.py reads both)."""
    from openai_ext.core.bodies import MAX_DEPTH

    with websockets.sync.client.connect(ws_url(rt), additional_headers={"Authorization": f"Bearer {KEY}"},
                                        max_size=None) as ws:
        raw_events(ws, "session.created")
        ws.send('{"type": "session.update", "event_id": "d1", "session": ' + "[" * 50_000 + "]" * 50_000 + "}")
        error = raw_events(ws, "error")[-1]["error"]
        assert error["code"] == "invalid_json" and str(MAX_DEPTH) in error["message"], error
        for literal in ("NaN", "-Infinity", "1e999"):
            ws.send('{"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": '
                    '{"type": "server_vad", "threshold": ' + literal + "}}}}}")
            error = raw_events(ws, "error")[-1]["error"]
            assert error["param"] == "session.audio.input.turn_detection.threshold", error
            assert error["code"] == "invalid_value" and "finite number" in error["message"]
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
        assert raw_events(ws, "session.updated")[-1]["session"]["instructions"] == "Be brief."


def test_a_wrong_key_is_refused_and_the_browser_subprotocol_is_taken(rt):
    for headers in ({"Authorization": "Bearer wrong"}, {}):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            websockets.sync.client.connect(ws_url(rt), additional_headers=headers)
        assert refused.value.response.status_code == 401
    with pytest.raises(websockets.exceptions.InvalidStatus):
        websockets.sync.client.connect(ws_url(rt), subprotocols=["realtime", "openai-insecure-api-key.wrong"])
    with websockets.sync.client.connect(ws_url(rt), subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"
        assert raw_events(ws, "session.created")[0]["session"]["object"] == "realtime.session"


def test_a_page_from_another_origin_is_refused(scripted_host, make_server):
    server = make_server(scripted_host, cors_origins=["http://app.example"])
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(ws_url(server), origin="http://evil.example")
    assert refused.value.response.status_code == 403
    with websockets.sync.client.connect(ws_url(server), origin="http://app.example") as ws:
        raw_events(ws, "session.created")


def test_sessions_past_the_limit_are_told_and_closed(rt):
    headers = {"Authorization": f"Bearer {KEY}"}
    with websockets.sync.client.connect(ws_url(rt), additional_headers=headers) as first, \
            websockets.sync.client.connect(ws_url(rt), additional_headers=headers) as second:
        raw_events(first, "session.created")
        raw_events(second, "session.created")
        with websockets.sync.client.connect(ws_url(rt), additional_headers=headers) as third:
            error = raw_events(third, "error")[-1]["error"]
            assert error["code"] == "session_limit_reached" and "realtime_max_sessions" in error["message"]
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                third.recv()
            assert closed.value.rcvd.code == 1013
    # the places are given back when sessions end (as soon as the server has seen them close)
    for _ in range(200):
        with websockets.sync.client.connect(ws_url(rt), additional_headers=headers) as again:
            if json.loads(again.recv())["type"] == "session.created":
                return
        time.sleep(0.05)
    raise AssertionError("the closed sessions' places were never given back")


# --- server VAD and barge-in ----------------------------------------------------------------------

@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.parametrize("detection", [None, {"type": "semantic_vad", "eagerness": "high"}])
def test_server_vad_finds_the_turn_and_answers_it(rt, say, detection):
    """With the default turn detection (server_vad), or semantic_vad, the server hears the speech
    start and stop (Silero), commits the turn and creates the response itself."""
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        session = events.next()["session"]
        assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        update = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 24}
        if detection:
            update["audio"] = {"input": {"turn_detection": detection}}
        connection.session.update(session=update)
        turn = events.next()["session"]["audio"]["input"]["turn_detection"]
        assert turn["type"] == (detection or {"type": "server_vad"})["type"]
        append(connection, silence(1.0) + say(QUESTION) + silence(1.5))
        out = events.until("response.done")
        started = of(out, "input_audio_buffer.speech_started")[0]
        stopped = of(out, "input_audio_buffer.speech_stopped")[0]
        assert 400 <= started["audio_start_ms"] <= 1000 < stopped["audio_end_ms"]
        assert started["item_id"] == stopped["item_id"] == of(out, "input_audio_buffer.committed")[0]["item_id"]
        heard = of(out, "conversation.item.input_audio_transcription.completed")[0]["transcript"].lower()
        assert "capital" in heard and "france" in heard
        assert of(out, "response.output_text.done")[0]["text"]


@pytest.mark.engines
@pytest.mark.slow
def test_speech_during_an_answer_cancels_it_and_the_answer_is_truncated(rt, say):
    """Barge-in: the user speaks while the answer is being spoken; the response ends cancelled
    (turn_detected), the next turn is answered, and conversation.item.truncate cuts the first
    answer's transcript to what was played."""
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.session.update(session={"type": "realtime", "max_output_tokens": 300,
                                           "instructions": "Tell a long story with many sentences."})
        events.next()
        append(connection, say("Tell me a long story about a dragon.") + silence(1.0))
        first = events.until("response.output_audio.delta")
        response_id = first[-1]["response_id"]
        item_id = first[-1]["item_id"]
        append(connection, say(QUESTION) + silence(1.0))
        out = events.until("response.done")
        assert out[-1]["response"]["id"] == response_id
        assert out[-1]["response"]["status"] == "cancelled"
        assert out[-1]["response"]["status_details"]["reason"] == "turn_detected"
        assert of(out, "input_audio_buffer.speech_started")
        after = events.until("response.done")
        assert after[-1]["response"]["id"] != response_id
        assert after[-1]["response"]["status"] in ("completed", "incomplete")
        # the answer keeps what can have been heard: the sentences whose audio had begun to play
        written = " ".join("".join(e["delta"] for e in first + out
                                   if e["type"] == "response.output_audio_transcript.delta").split())
        cut = of(out, "conversation.item.truncated")[0]
        answer = out[-1]["response"]["output"][0]
        assert cut["item_id"] == item_id and answer["status"] == "incomplete"
        assert written.startswith(answer["content"][0]["transcript"])
        assert of(out, "response.output_audio_transcript.done")[0]["transcript"] == answer["content"][0]["transcript"]
        # and the client may cut it to what it played
        connection.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=1)
        assert events.until("conversation.item.truncated")[-1]["audio_end_ms"] == 1
        connection.send({"type": "conversation.item.retrieve", "item_id": item_id})
        kept = events.until("conversation.item.retrieved")[-1]["item"]["content"][0]["transcript"]
        assert kept and len(kept) < len(written) and written.startswith(kept)


# --- responses out of band, cancelled -------------------------------------------------------------

def test_an_out_of_band_response_and_a_cancelled_one(rt, script):
    """conversation "none": the response's items stay out of the conversation. response.cancel
    ends a response as cancelled (client_cancelled), and the session takes the next one."""
    _, long = script.script("Blue.", held())   # the second response runs until it is cancelled
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        events.next()
        connection.response.create(response={
            "conversation": "none", "max_output_tokens": 16, "metadata": {"topic": "colour"},
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "Name a colour."}]}]})
        out = events.until("response.done")
        assert not of(out, "conversation.item.added") and out[-1]["response"]["metadata"] == {"topic": "colour"}
        item_id = out[-1]["response"]["output"][0]["id"]
        connection.send({"type": "conversation.item.retrieve", "item_id": item_id, "event_id": "r1"})
        assert events.until("error")[-1]["error"]["code"] == "item_not_found"
        connection.response.create(response={"max_output_tokens": 1000,
                                             "instructions": "Write a very long essay about the sea."})
        created = events.until("response.created")[-1]["response"]
        assert long.started.wait(60)   # it is generating now
        connection.response.create()
        assert events.until("error")[-1]["error"]["code"] == "conversation_already_has_active_response"
        connection.response.cancel()
        done = events.until("response.done")[-1]["response"]
        assert done["id"] == created["id"] and done["status"] == "cancelled"
        assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        connection.response.create(response={"max_output_tokens": 8})
        assert events.until("response.done")[-1]["response"]["status"] in ("completed", "incomplete")


# --- limits --------------------------------------------------------------------------------------

def test_the_input_buffer_and_the_session_length_are_bounded(scripted_host, make_server):
    server = make_server(scripted_host, realtime_max_buffer_s=1.0, realtime_max_session_s=2.0)
    with client(server).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        events.next()
        append(connection, silence(1.0))
        connection.input_audio_buffer.append(audio=base64.b64encode(silence(0.5)).decode(), event_id="a1")
        error = events.until("error")[-1]["error"]
        assert error["code"] == "input_audio_buffer_full" and error["event_id"] == "a1"
        assert "realtime_max_buffer_s" in error["message"]
        connection.input_audio_buffer.clear()
        assert events.next()["type"] == "input_audio_buffer.cleared"
        connection.input_audio_buffer.append(audio=base64.b64encode(silence(0.5)).decode())
        connection.input_audio_buffer.commit()
        assert events.until("input_audio_buffer.committed")
        # the session ends at its maximum length, with an error event that says so
        expired = events.until("error")[-1]["error"]
        assert expired["code"] == "session_expired" and "realtime_max_session_s" in expired["message"]


def test_g711_round_trips():
    from openai_ext.realtime.audio import from_pcm16, to_float

    tone = (np.sin(np.arange(8000) / 5) * 12000).astype("<i2")
    for fmt in ("audio/pcmu", "audio/pcma"):
        coded = from_pcm16(tone.tobytes(), fmt)
        assert len(coded) == tone.size
        back = to_float(coded, fmt) * 32768
        # G.711 keeps about 12 bits: the error is a small part of each sample
        assert np.max(np.abs(back - tone) / np.maximum(np.abs(tone), 256)) < 0.07


@pytest.mark.engines
@pytest.mark.slow
def test_a_spoken_turn_in_telephony_audio(rt, say):
    """audio/pcmu (8 kHz G.711) in and out, as telephony bridges send it."""
    from openai_ext.realtime.audio import Resampler, from_pcm16, to_float

    pcm24 = np.frombuffer(say(QUESTION), "<i2").astype(np.float32) / 32768
    narrow = Resampler(24_000, 8000)(pcm24)
    ulaw = from_pcm16((np.clip(narrow, -1, 1) * 32767).astype("<i2").tobytes(), "audio/pcmu")
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.session.update(session={"type": "realtime", "max_output_tokens": 30,
                                           "instructions": "Answer in one short sentence.",
                                           "audio": {"input": {"format": {"type": "audio/pcmu"},
                                                               "turn_detection": None},
                                                     "output": {"format": {"type": "audio/pcmu"}}}})
        session = events.next()["session"]
        assert session["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        for at in range(0, len(ulaw), 4000):
            connection.input_audio_buffer.append(audio=base64.b64encode(ulaw[at:at + 4000]).decode())
        connection.input_audio_buffer.commit()
        connection.response.create()
        out = events.until("response.done")
        heard = of(out, "conversation.item.input_audio_transcription.completed")[0]["transcript"].lower()
        assert "capital" in heard and "france" in heard
        data = b"".join(base64.b64decode(e["delta"]) for e in of(out, "response.output_audio.delta"))
        speech = to_float(data, "audio/pcmu")
        assert len(speech) > 8000 * 0.5 and float(np.sqrt(np.mean(speech ** 2))) > 0.02


@pytest.mark.engines
@pytest.mark.slow
def test_an_audio_item_is_heard_and_a_client_that_leaves_stops_its_answer(rt, say, script):
    """conversation.item.create with an input_audio part carrying audio: it is transcribed as a
    committed turn is. A client that goes away mid-answer leaves nothing running."""
    from support.servers import idle

    [answer] = script.script(held())   # the answer runs until its client leaves
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_audio", "audio": base64.b64encode(say(QUESTION)).decode()}]})
        out = events.until("conversation.item.done")
        heard = of(out, "conversation.item.input_audio_transcription.completed")[0]["transcript"].lower()
        assert "capital" in heard and "france" in heard
        assert "audio" not in out[-1]["item"]["content"][0]
        connection.response.create(response={"max_output_tokens": 1000, "output_modalities": ["text"],
                                             "instructions": "Write a very long essay about France."})
        events.until("response.output_text.delta")
    assert idle(rt, script, timeout=60) and answer.ended.is_set()


def test_malformed_fields_of_every_event_are_client_errors(rt):
    """Every client event type with fields of every wrong kind: each is answered (an error event of
    the client's kind, never a server error) and the session serves on."""
    from openai_ext.realtime.events import CLIENT_EVENTS

    odd = [None, 7, -1, 1.5, True, "x", [], [1, "a"], {}, {"type": 3}, {"type": "message"}, "A" * 10]
    fields = ["session", "audio", "item", "item_id", "previous_item_id", "response", "response_id",
              "content_index", "audio_end_ms"]
    with websockets.sync.client.connect(ws_url(rt), additional_headers={"Authorization": f"Bearer {KEY}"},
                                        max_size=None) as ws:
        raw_events(ws, "session.created")
        n = 0
        for kind in CLIENT_EVENTS:
            if kind in ("response.create", "output_audio_buffer.clear", "input_audio_buffer.clear"):
                continue     # valid without any field: they would start work, not fail
            for name in fields:
                for value in odd:
                    n += 1
                    ws.send(json.dumps({"type": kind, name: value, "event_id": f"f{n}"}))
                    answer = raw_events(ws, "error", "session.updated", "conversation.item.added",
                                        "input_audio_buffer.cleared", "input_audio_buffer.committed")[-1]
                    if answer["type"] == "error":
                        assert answer["error"]["type"] == "invalid_request_error", (kind, name, value, answer)
                    else:
                        # a commit of a few samples, an item that was in fact valid: take the rest of
                        # its answer (a transcription's events), then go on
                        if answer["type"] == "input_audio_buffer.committed":
                            raw_events(ws, "conversation.item.done")
        for bad in ({"instructions": 5}, {"output_modalities": "audio"}, {"audio": {"input": {"format": "pcm"}}},
                    {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "soon"}}}},
                    {"audio": {"output": {"voice": "nobody-at-all"}}}, {"tools": [{"type": "mcp"}]},
                    {"tool_choice": {"type": "function"}}, {"max_output_tokens": 0}, {"temperature": 9},
                    {"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}}):
            ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", **bad}}))
            error = raw_events(ws, "error", "session.updated")[-1]
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", (bad, error)
        for bad in ({"conversation": "other"}, {"input": "text"}, {"tools": 3}, {"output_modalities": []},
                    {"input": [{"type": "item_reference", "id": "item_nope"}]}):
            ws.send(json.dumps({"type": "response.create", "response": bad}))
            error = raw_events(ws, "error", "response.created")[-1]
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", (bad, error)
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Still here."}}))
        assert raw_events(ws, "session.updated")[-1]["session"]["instructions"] == "Still here."


def test_in_extension_mode_the_web_uis_model_answers(extension):
    with client(extension.server, key="x").realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "max_output_tokens": 16})
        events.next()
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hi"}]})
        events.until("conversation.item.done")
        connection.response.create()
        out = events.until("response.done")
        assert out[-1]["response"]["status"] in ("completed", "incomplete")
        assert of(out, "response.output_text.done")[0]["text"]


@pytest.mark.slow
def test_a_conversation_longer_than_the_context_forgets_its_start(rt):
    """OpenAI's truncation "auto": the oldest turns are left out of the prompt once the conversation
    outgrows the model's context (2048 tokens here), and answers go on."""
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "instructions": "Be brief.", "max_output_tokens": 8})
        events.next()
        filler = " ".join(f"Sentence {n} is here to make this message long." for n in range(30))
        for n in range(8):
            for role, kind in (("user", "input_text"), ("assistant", "output_text")):
                connection.conversation.item.create(item={"type": "message", "role": role,
                                                          "content": [{"type": kind, "text": f"{n}: {filler}"}]})
                events.until("conversation.item.done")
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Say hello."}]})
        events.until("conversation.item.done")
        connection.response.create()
        done = events.until("response.done")[-1]["response"]
        assert done["status"] in ("completed", "incomplete") and done["usage"]["input_tokens"] < 2048


def test_a_speech_engine_that_fails_fails_the_response_not_the_session(rt, monkeypatch):
    from openai_ext.core.errors import ServiceUnavailableError

    async def no_voice(name):
        raise ServiceUnavailableError("Speech needs piper, which is not installed. Run: pip install piper-tts",
                                      code="engine_unavailable")
    monkeypatch.setattr(rt.app.state.api.realtime, "voice", no_voice)
    with client(rt).realtime.connect(model=MODEL) as connection:
        events = Events(connection)
        events.next()
        connection.response.create(response={"max_output_tokens": 24, "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say: hello there."}]}]})
        out = events.until("error")
        assert out[-1]["error"]["code"] == "engine_unavailable" and "pip install" in out[-1]["error"]["message"]
        done = events.until("response.done")[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "engine_unavailable"
        monkeypatch.undo()
        connection.session.update(session={"type": "realtime", "instructions": "Still serving."})
        assert events.until("session.updated")[-1]["session"]["instructions"] == "Still serving."


def test_allow_unknown_fields_lets_a_session_field_no_session_has_pass():
    from openai_ext.realtime import session as session_mod
    from openai_ext.realtime.events import ClientEventError

    config = session_mod.SessionConfig()
    with pytest.raises(ClientEventError) as e:
        session_mod.update(config, {"type": "realtime", "audio": {"input": {"transcription": {"modle": "x"}}}},
                           lambda voice: None)
    assert e.value.param == "session.audio.input.transcription.modle" and "'model'" in e.value.message
    kept = session_mod.update(config, {"type": "realtime", "instructions": "Hi", "extra_thing": 1},
                              lambda voice: None, allow_unknown=True)
    assert kept.instructions == "Hi"
