"""The Realtime try-it page (GET /v1/realtime/page): served without the key, it speaks the
protocol the server takes, and its own origin may open the WebSocket."""

from __future__ import annotations

import re

import httpx
import pytest
import websockets.exceptions
import websockets.sync.client

KEY = "sk-realtime-page-test"


@pytest.fixture(scope="module")
def server(llama_host, make_server):
    return make_server(llama_host, api_key=KEY)


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


def test_a_page_of_the_servers_own_origin_may_connect_and_another_may_not(llama_host, make_server):
    """With cors_origins narrowed (by default it is "*"), the page still reaches its own server."""
    server = make_server(llama_host, api_key=KEY, cors_origins=["http://app.example"])
    ws_url = server.url.replace("http://", "ws://") + "/realtime"
    own = server.url.split("/v1")[0]
    protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
    with websockets.sync.client.connect(ws_url, origin=own, subprotocols=protocols) as ws:
        assert ws.subprotocol == "realtime"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(ws_url, origin="http://evil.example", subprotocols=protocols)
    assert refused.value.response.status_code == 403
