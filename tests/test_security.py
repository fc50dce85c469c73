"""Keys, the Host check, CORS, HTTPS, IPv6 and body limits, on the real server."""

from __future__ import annotations

import logging
import socket
import ssl
import subprocess

import httpx
import openai
import pytest

from conftest import openai_client
from openai_spec import assert_valid

KEY = "sk-local-test-key-123"
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def keyed(llama_host, make_server):
    return make_server(llama_host, api_key=KEY, admin_key="admin-key-456")


def auth(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/models", None),
    ("GET", "/models/x", None),
    ("POST", "/chat/completions", CHAT),
    ("POST", "/chat/completions", {**CHAT, "stream": True}),
    ("POST", "/completions", {"prompt": "hi", "max_tokens": 2}),
])
def test_every_route_but_health_needs_the_key(keyed, method, path, body):
    for base in (keyed.url, keyed.url.removesuffix("/v1")):
        for headers in ({}, auth("wrong"), {"Authorization": KEY}):
            r = httpx.request(method, base + path, json=body, headers=headers, timeout=60)
            assert r.status_code == 401, (path, headers, r.text)
            assert_valid("ErrorResponse", r.json())
            assert r.json()["error"]["code"] == "invalid_api_key"
        ok = httpx.request(method, base + path, json=body, headers=auth(KEY), timeout=60)
        assert ok.status_code in (200, 404), ok.text       # 404: the model id 'x' does not exist


def every_route(app):
    """(method, path) of every route the app serves (its schema's), with and without /v1, with
    path parameters filled in."""
    for path, operations in app.openapi()["paths"].items():
        path = path.replace("{engine_id}", "x").replace("{model_id}", "x")
        for method in operations:
            yield method.upper(), path
            yield method.upper(), path.removeprefix("/v1")


def test_the_key_guards_all_routes_before_reading_the_body(keyed):
    """Streaming, multipart, legacy, internal and the schema itself: without the key, 401, and
    the body (here not even valid JSON) is never read."""
    routes = sorted(set(every_route(keyed.app)))
    assert len(routes) > 60 and ("POST", "/v1/audio/transcriptions") in routes and ("POST", "/edits") in routes
    base = keyed.url.removesuffix("/v1")
    for method, path in routes + [("GET", "/openapi.json")]:
        if path in ("/health", "/v1/internal/health"):
            continue
        r = httpx.request(method, base + path, content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 401, (method, path, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key"
    upload = httpx.post(keyed.url + "/audio/transcriptions", files={"file": ("a.wav", b"RIFF" + bytes(5000))},
                        data={"model": "whisper-1"})
    assert upload.status_code == 401


def test_admin_routes_refuse_web_pages_when_no_key_is_set(live):
    # A page on any site may call the API (CORS allows every origin), but not manage models.
    r = httpx.get(live.url + "/internal/model/list", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    assert r.headers["access-control-allow-origin"] == "*"     # readable, so the page's author sees why
    r = httpx.post(live.url + "/internal/model/unload", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and live.app.state.api.host.loaded
    # the ordinary routes stay open to web apps
    assert httpx.get(live.url + "/models", headers={"Origin": "https://evil.example"}).status_code == 200


def test_health_needs_no_key(keyed):
    r = httpx.get(keyed.url.removesuffix("/v1") + "/health")
    assert r.status_code == 200 and r.json()["model_loaded"] is True


def test_official_client_with_the_key(keyed):
    with pytest.raises(openai.AuthenticationError):
        openai_client(keyed, api_key="nope").models.list()
    assert openai_client(keyed, api_key=KEY).models.list().data


def test_the_admin_key_also_opens_ordinary_routes(keyed):
    assert httpx.get(keyed.url + "/models", headers=auth("admin-key-456")).status_code == 200


def test_keys_never_reach_the_log(llama_host, make_server, caplog):
    server = make_server(llama_host, api_key=KEY, debug=True)
    with caplog.at_level(logging.DEBUG):
        httpx.post(server.url + "/chat/completions", json=CHAT, headers=auth(KEY), timeout=60)
        httpx.post(server.url + "/chat/completions", json=CHAT, headers=auth(KEY + "x"), timeout=60)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert KEY not in text


def test_foreign_host_header_is_refused_while_local_only(live):
    r = httpx.get(live.url + "/models", headers={"Host": "attacker.example:5001"})
    assert r.status_code == 400 and "Host" in r.json()["error"]["message"]
    assert_valid("ErrorResponse", r.json())
    for name in ("localhost:1234", "127.0.0.1", "[::1]:80"):
        assert httpx.get(live.url + "/models", headers={"Host": name}).status_code == 200


def test_allowed_hosts_and_listen_open_the_host_check(llama_host, make_server):
    docker = make_server(llama_host, allowed_hosts=["api.docker.internal"])
    assert httpx.get(docker.url + "/models", headers={"Host": "api.docker.internal:5001"}).status_code == 200
    assert httpx.get(docker.url + "/models", headers={"Host": "other.example"}).status_code == 400
    lan = make_server(llama_host, listen=True, listen_host="127.0.0.1")
    assert httpx.get(lan.url + "/models", headers={"Host": "my-pc.lan:5001"}).status_code == 200


def test_cors_allows_all_origins_by_default(live):
    pre = httpx.options(live.url + "/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] in ("*", "http://localhost:3000")
    r = httpx.get(live.url + "/models", headers={"Origin": "http://example.org"})
    assert r.headers["access-control-allow-origin"] == "*"


def test_cors_origins_setting(llama_host, make_server):
    strict = make_server(llama_host, cors_origins=["http://app.local"])
    assert httpx.get(strict.url + "/models", headers={"Origin": "http://app.local"}).headers[
        "access-control-allow-origin"] == "http://app.local"
    assert "access-control-allow-origin" not in httpx.get(strict.url + "/models",
                                                          headers={"Origin": "http://evil.example"}).headers
    off = make_server(llama_host, cors_origins=[])
    assert "access-control-allow-origin" not in httpx.get(off.url + "/models",
                                                          headers={"Origin": "http://app.local"}).headers


def test_https_with_a_certificate(llama_host, make_server, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = make_server(llama_host, cert_path=str(cert), key_path=str(key))
    assert server.url.startswith("https://")
    r = httpx.post(server.url + "/chat/completions", json=CHAT, timeout=60,
                   verify=ssl.create_default_context(cafile=str(cert)))
    assert r.status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url.replace("https://", "http://") + "/models", timeout=5)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6(llama_host, make_server):
    server = make_server(llama_host, ipv6=True)
    r = httpx.get(f"http://[::1]:{server.port}/v1/models")
    assert r.status_code == 200
    assert httpx.get(f"http://127.0.0.1:{server.port}/v1/models").status_code == 200


def test_bind_addresses():
    from openai_ext.config import Settings
    from openai_ext.server import bind_addresses

    assert bind_addresses(Settings()) == ["127.0.0.1"]
    assert bind_addresses(Settings(ipv6=True)) == ["127.0.0.1", "::1"]
    assert bind_addresses(Settings(listen=True, ipv6=True)) == ["0.0.0.0", "::"]
    assert bind_addresses(Settings(listen=True, listen_host="::", ipv6=True)) == ["::"]   # not bound twice
    assert bind_addresses(Settings(listen_host="0.0.0.0")) == ["127.0.0.1"]            # listen is off


def test_json_body_over_the_limit_is_413(llama_host, make_server):
    small = make_server(llama_host, max_body_mb=0.01)   # about 10 kB
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 20_000}]}
    r = httpx.post(small.url + "/chat/completions", json=big, timeout=30)
    assert r.status_code == 413 and "max_body_mb" in r.json()["error"]["message"]
    assert_valid("ErrorResponse", r.json())

    def chunked():   # no Content-Length: the limit still holds while the body streams in
        for _ in range(30):
            yield b"x" * 1000
    r = httpx.post(small.url + "/completions", content=chunked(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert httpx.post(small.url + "/chat/completions", json=CHAT, timeout=60).status_code == 200


def test_upload_routes_have_the_upload_limit(llama_host, make_server):
    server = make_server(llama_host, max_upload_mb=0.05, max_body_mb=1)
    files = {"file": ("a.wav", b"\0" * 200_000, "audio/wav")}
    r = httpx.post(server.url + "/audio/transcriptions", data={"model": "whisper-1"}, files=files, timeout=30)
    assert r.status_code == 413 and "max_upload_mb" in r.json()["error"]["message"]
