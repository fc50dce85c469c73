"""The Realtime try-it page (GET /v1/realtime/page): served without the key, it speaks the
protocol the server takes, and in headless Chromium, with a fake microphone fed from a WAV file,
push to talk gets the question heard, the answer transcribed and its audio queued for playback.

The browser test needs Debian's chromium (.ci/run installs it) and playwright, which drives the
installed browser (no browser download); without either it is skipped, with the reason."""

from __future__ import annotations

import re
import shutil
import wave

import httpx
import numpy as np
import pytest
import websockets.exceptions
import websockets.sync.client

KEY = "sk-realtime-page-test"


@pytest.fixture(scope="module")
def server(scripted_host, make_server):
    return make_server(scripted_host, api_key=KEY)


def page_url(server) -> str:
    return server.url + "/realtime/page"


def test_the_page_is_served_without_the_key_and_holds_no_secret(server):
    for url in (page_url(server), page_url(server).replace("/v1/", "/")):
        r = httpx.get(url)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/html")
        assert KEY not in r.text
    # everything else still needs it
    assert httpx.get(server.url + "/models").status_code == 401


def test_the_page_speaks_the_realtime_protocol_and_loads_nothing_from_elsewhere(server):
    html = httpx.get(page_url(server)).text
    sent = set(re.findall(r'send\(\{type: "([a-z_.]+)"', html))
    assert {"session.update", "input_audio_buffer.append", "input_audio_buffer.commit", "response.create",
            "input_audio_buffer.clear", "response.cancel"} <= sent
    assert "turn_detection: null" in html
    handled = set(re.findall(r'case "([a-z_.]+)":', html))
    assert {"conversation.item.input_audio_transcription.completed", "response.output_audio_transcript.delta",
            "response.output_audio.delta", "error"} <= handled
    assert "openai-insecure-api-key." in html and "getUserMedia" in html
    # offline: no script, style or media from another host
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html)


def test_a_page_of_the_servers_own_origin_may_connect_and_another_may_not(scripted_host, make_server):
    """With cors_origins narrowed (by default it is "*"), the page still reaches its own server."""
    server = make_server(scripted_host, api_key=KEY, cors_origins=["http://app.example"])
    ws_url = server.url.replace("http://", "ws://") + "/realtime"
    own = server.url.split("/v1")[0]
    protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
    with websockets.sync.client.connect(ws_url, origin=own, subprotocols=protocols) as ws:
        assert ws.subprotocol == "realtime"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(ws_url, origin="http://evil.example", subprotocols=protocols)
    assert refused.value.response.status_code == 403


# --- in a browser --------------------------------------------------------------------------------

QUESTION = "What is the capital of France?"


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory):
    """The question as a 48 kHz mono PCM16 WAV (piper's voice, resampled), between silences: the
    fake microphone plays it in a loop."""
    from openai_ext.audio.speech import render
    from openai_ext.audio.tts import load_engine
    from openai_ext.core.config import Settings

    tts = load_engine(Settings())
    speech = np.frombuffer(render(tts, QUESTION, tts.default_voice, fmt="pcm"), "<i2").astype(np.float32)
    pad = np.zeros(int(24_000 * 0.7), np.float32)
    at24 = np.concatenate([pad, speech, pad])
    at48 = np.interp(np.arange(len(at24) * 2) / 2, np.arange(len(at24)), at24)
    path = tmp_path_factory.mktemp("mic") / "question.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48_000)
        w.writeframes(np.clip(at48, -32768, 32767).astype("<i2").tobytes())
    return path, len(at24) / 24_000


@pytest.mark.engines
@pytest.mark.slow
def test_push_to_talk_in_a_browser(server, question_wav):
    executable = chromium()
    if executable is None:
        pytest.skip("no chromium found (Debian: apt-get install chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements-dev.txt)")
    wav, seconds = question_wav
    args = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}", "--autoplay-policy=no-user-gesture-required",
            "--no-sandbox"]
    watchdog = 180_000   # ms: a deadline for each wait, not a timing; progress is read from the page
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True, args=args)
        try:
            tab = browser.new_page()
            problems: list[str] = []
            tab.on("pageerror", lambda e: problems.append(str(e)))
            tab.goto(page_url(server))
            tab.fill("#key", KEY)
            tab.click("#connect")
            tab.wait_for_function("window.realtimePage.state === 'connected'", timeout=watchdog)
            assert tab.is_enabled("#talk")

            # hold the button until the microphone has sent the looped question twice over, so
            # one whole question is in the buffer wherever the loop was when the button went down
            tab.hover("#talk")
            tab.mouse.down()
            tab.wait_for_function(f"window.realtimePage.secondsSent >= {2 * seconds + 0.5}", timeout=watchdog)
            assert tab.evaluate("document.querySelector('#talk').classList.contains('held')")
            tab.mouse.up()
            assert tab.evaluate("window.realtimePage.commits") == 1

            # the user's transcript first, then the answer's, growing, with its audio queued
            tab.wait_for_function("window.realtimePage.userTranscripts.length > 0", timeout=watchdog)
            heard = tab.inner_text(".turn.user")
            assert "france" in heard.lower(), heard
            tab.wait_for_function("window.realtimePage.events.includes('response.done')", timeout=watchdog)
            state = tab.evaluate("window.realtimePage")
            events = state["events"]
            assert events.index("conversation.item.input_audio_transcription.completed") < \
                events.index("response.output_audio_transcript.delta") < events.index("response.done")
            assert events.count("response.output_audio_transcript.delta") > 1   # it grew, piece by piece
            answer = tab.inner_text(".turn.assistant")
            assert answer.strip() and answer.strip() == state["assistantTranscripts"][0].strip()
            assert state["audioDeltas"] > 0 and state["chunksQueued"] == state["audioDeltas"]
            assert state["secondsQueued"] > 0.5
            assert not state["errors"] and not problems, (state["errors"], problems)
            # and the queued audio plays through
            tab.wait_for_function("window.realtimePage.chunksPlayed > 0", timeout=watchdog)
        finally:
            browser.close()
