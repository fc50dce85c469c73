"""Keys, the Host check, CORS, HTTPS, IPv6 and body limits, on the real server."""

from __future__ import annotations

import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import time

import httpx
import openai
import pytest
from support import ROOT
from support.servers import has_ipv6_loopback, openai_client
from support.spec import assert_valid

KEY = "sk-local-test-key-123"
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def keyed(scripted_host, make_server):
    return make_server(scripted_host, api_key=KEY, admin_key="admin-key-456")


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
    with httpx.Client() as http:   # one connection for them all
        for method, path in routes + [("GET", "/openapi.json")]:
            if path in ("/health", "/v1/internal/health"):
                continue
            r = http.request(method, base + path, content=b"{not json", headers={"Content-Type": "application/json"})
            assert r.status_code == 401, (method, path, r.text)
            if path.removeprefix("/v1").startswith("/messages"):   # Anthropic's API, Anthropic's error
                assert r.json()["error"]["type"] == "authentication_error"
            else:
                assert r.json()["error"]["code"] == "invalid_api_key"
    upload = httpx.post(keyed.url + "/audio/transcriptions", files={"file": ("a.wav", b"RIFF" + bytes(5000))},
                        data={"model": "whisper-1"})
    assert upload.status_code == 401


def test_admin_routes_refuse_web_pages_when_no_key_is_set(scripted):
    # A page on any site may call the API (CORS allows every origin), but not manage models.
    r = httpx.get(scripted.url + "/internal/model/list", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    assert r.headers["access-control-allow-origin"] == "*"     # readable, so the page's author sees why
    r = httpx.post(scripted.url + "/internal/model/unload", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and scripted.app.state.api.host.loaded
    # the ordinary routes stay open to web apps
    assert httpx.get(scripted.url + "/models", headers={"Origin": "https://evil.example"}).status_code == 200


def test_stop_generation_needs_the_admin_key(keyed, scripted):
    # it stops whatever runs, other users' generations included
    url = keyed.url + "/internal/stop-generation"
    for headers in ({}, auth(KEY), auth("wrong")):
        r = httpx.post(url, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert_valid("ErrorResponse", r.json())
    assert httpx.post(url, headers=auth("admin-key-456")).json() == "OK"
    # with no key at all, not from a web page
    r = httpx.post(scripted.url + "/internal/stop-generation", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"


def test_the_admin_key_defaults_to_the_api_key(scripted_host, make_server):
    server = make_server(scripted_host, api_key=KEY)
    url = server.url + "/internal/stop-generation"
    assert httpx.post(url, headers=auth(KEY)).json() == "OK"
    assert httpx.post(url, headers=auth("admin-key-456")).status_code == 401
    assert httpx.post(url).status_code == 401


def test_an_open_tunnel_closes_the_admin_routes(scripted_host, make_server):
    """With the tunnel open and no key, any request may come from the internet through it."""
    server = make_server(scripted_host, public_api=True, allow_open_tunnel=True)
    for method, path in (("GET", "/internal/model/list"), ("POST", "/internal/model/unload"),
                         ("POST", "/internal/lora/load"), ("POST", "/internal/stop-generation")):
        r = httpx.request(method, server.url + path, json={"lora_names": []})
        assert r.status_code == 403 and "tunnel" in r.json()["error"]["message"], (path, r.text)
        assert_valid("ErrorResponse", r.json())
    assert server.app.state.api.host.loaded
    assert httpx.get(server.url + "/models").status_code == 200      # the API itself stays open
    # a key opens them again; so does a tunnel that is refused for want of a key
    keyed = make_server(scripted_host, public_api=True, api_key=KEY)
    assert httpx.post(keyed.url + "/internal/stop-generation", headers=auth(KEY)).json() == "OK"
    refused = make_server(scripted_host, public_api=True)
    assert httpx.post(refused.url + "/internal/stop-generation").json() == "OK"


@pytest.mark.parametrize("field", ["api_key", "admin_key"])
@pytest.mark.parametrize("key", ["clé-secrète", " sk-padded", "sk-tab\there", "sk-line\n"])
def test_a_key_no_header_can_carry_is_a_settings_error(field, key):
    from openai_ext.core.config import SettingsError, load_settings

    with pytest.raises(SettingsError) as e:
        load_settings(cli={field: key}, file="/nonexistent/settings.json")
    message = str(e.value)
    assert field in message and "ASCII" in message and key.strip() not in message
    assert load_settings(cli={field: "sk-plain ascii_key.123"}, file="/nonexistent/settings.json")


def test_health_needs_no_key(keyed):
    r = httpx.get(keyed.url.removesuffix("/v1") + "/health")
    assert r.status_code == 200 and r.json()["model_loaded"] is True


def test_official_client_with_the_key(keyed):
    with pytest.raises(openai.AuthenticationError):
        openai_client(keyed, api_key="nope").models.list()
    assert openai_client(keyed, api_key=KEY).models.list().data


def test_the_admin_key_also_opens_ordinary_routes(keyed):
    assert httpx.get(keyed.url + "/models", headers=auth("admin-key-456")).status_code == 200


ENV_KEY = "sk-from-the-environment-7f3a9c"


@pytest.mark.slow  # starts a process
def test_a_standalone_server_takes_its_key_from_the_environment_and_never_prints_it(tmp_path):
    """python -m openai_ext with OPENEDAI_API_KEY, debug logging and uvicorn's access log on: the
    key guards the server, and appears nowhere in what it prints."""
    root = ROOT
    out, err = open(tmp_path / "out.log", "w+"), open(tmp_path / "err.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "openai_ext", "--port", "0", "--n-ctx", "512", "--debug"],
                            cwd=root, stdout=out, stderr=err,
                            env={**os.environ, "PYTHONPATH": str(root), "OPENEDAI_API_KEY": ENV_KEY})
    try:
        url = None
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "err.log").read_text()
            match = re.search(r"API at (http://127\.0\.0\.1:\d+/v1)", (tmp_path / "err.log").read_text())
            url = match and match.group(1)
            time.sleep(0.2)
        assert url, "the server did not announce its URL"
        wait_for_health(url)
        assert httpx.get(url + "/models").status_code == 401
        assert httpx.get(url + "/models", headers=auth(ENV_KEY + "x")).status_code == 401
        assert httpx.get(url + "/models", headers=auth(ENV_KEY)).status_code == 200
        r = httpx.post(url + "/chat/completions", json={**CHAT, "stream": True}, headers=auth(ENV_KEY), timeout=60)
        assert r.status_code == 200 and "[DONE]" in r.text
        assert httpx.post(url + "/internal/stop-generation", headers=auth(ENV_KEY)).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    printed = (tmp_path / "out.log").read_text() + (tmp_path / "err.log").read_text()
    assert '"GET /v1/models HTTP/1.1" 401' in printed     # the access log was on
    assert ENV_KEY not in printed


def wait_for_health(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url.removesuffix("/v1") + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server never became healthy")


def test_keys_never_reach_the_log(scripted_host, make_server, caplog, monkeypatch):
    server = make_server(scripted_host, api_key=KEY, debug=True)
    # uvicorn's loggers do not propagate to the root logger: listen to them directly
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        monkeypatch.setattr(logging.getLogger(name), "handlers", [*logging.getLogger(name).handlers, caplog.handler])
    with caplog.at_level(logging.DEBUG):
        httpx.post(server.url + "/chat/completions", json=CHAT, headers=auth(KEY), timeout=60)
        httpx.post(server.url + "/chat/completions", json=CHAT, headers=auth(KEY + "x"), timeout=60)
        httpx.post(server.url + "/internal/stop-generation", headers=auth("not-" + KEY), timeout=60)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert any(r.name == "uvicorn.access" for r in caplog.records), "the access log was not heard"
    assert KEY not in text


def test_foreign_host_header_is_refused_while_local_only(scripted):
    r = httpx.get(scripted.url + "/models", headers={"Host": "attacker.example:5001"})
    assert r.status_code == 400 and "Host" in r.json()["error"]["message"]
    assert_valid("ErrorResponse", r.json())
    for name in ("localhost:1234", "127.0.0.1", "[::1]:80"):
        assert httpx.get(scripted.url + "/models", headers={"Host": name}).status_code == 200


@pytest.mark.parametrize("host", ["localhost:5001@evil.example", "localhost@evil.example", "evil.example#localhost",
                                  "localhost/x", "127.0.0.1 evil.example", "[::1]x", ""])
def test_a_malformed_host_header_names_no_local_host(scripted, host):
    r = httpx.get(scripted.url + "/models", headers={"Host": host})
    assert r.status_code == 400 and "Host" in r.json()["error"]["message"]


def test_allowed_hosts_and_listen_open_the_host_check(scripted_host, make_server):
    docker = make_server(scripted_host, allowed_hosts=["api.docker.internal"])
    assert httpx.get(docker.url + "/models", headers={"Host": "api.docker.internal:5001"}).status_code == 200
    assert httpx.get(docker.url + "/models", headers={"Host": "other.example"}).status_code == 400
    lan = make_server(scripted_host, listen=True, listen_host="127.0.0.1")
    assert httpx.get(lan.url + "/models", headers={"Host": "my-pc.lan:5001"}).status_code == 200


def test_cors_allows_all_origins_by_default(scripted):
    pre = httpx.options(scripted.url + "/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] in ("*", "http://localhost:3000")
    r = httpx.get(scripted.url + "/models", headers={"Origin": "http://example.org"})
    assert r.headers["access-control-allow-origin"] == "*"


def test_cors_origins_setting(scripted_host, make_server):
    strict = make_server(scripted_host, cors_origins=["http://app.local"])
    assert httpx.get(strict.url + "/models", headers={"Origin": "http://app.local"}).headers[
        "access-control-allow-origin"] == "http://app.local"
    assert "access-control-allow-origin" not in httpx.get(strict.url + "/models",
                                                          headers={"Origin": "http://evil.example"}).headers
    off = make_server(scripted_host, cors_origins=[])
    assert "access-control-allow-origin" not in httpx.get(off.url + "/models",
                                                          headers={"Origin": "http://app.local"}).headers


def test_https_with_a_certificate(scripted_host, make_server, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = make_server(scripted_host, cert_path=str(cert), key_path=str(key))
    assert server.url.startswith("https://")
    r = httpx.post(server.url + "/chat/completions", json=CHAT, timeout=60,
                   verify=ssl.create_default_context(cafile=str(cert)))
    assert r.status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url.replace("https://", "http://") + "/models", timeout=5)


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6(scripted_host, make_server):
    server = make_server(scripted_host, ipv6=True)
    r = httpx.get(f"http://[::1]:{server.port}/v1/models")
    assert r.status_code == 200
    assert httpx.get(f"http://127.0.0.1:{server.port}/v1/models").status_code == 200


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_listen_host_all_ipv6_addresses_also_answers_ipv4(scripted_host, make_server):
    """listen_host "::" is one dual-stack socket: the URL it announces (127.0.0.1) answers."""
    server = make_server(scripted_host, listen=True, listen_host="::")
    assert server.url == f"http://127.0.0.1:{server.port}/v1"
    assert httpx.get(server.url + "/models").status_code == 200
    assert httpx.get(f"http://[::1]:{server.port}/v1/models").status_code == 200
    # beside an IPv4 socket, the IPv6 one is IPv6-only, so both share the port
    both = make_server(scripted_host, listen=True, ipv6=True)
    assert [s.family for s in both.sockets] == [socket.AF_INET, socket.AF_INET6]
    assert httpx.get(f"http://[::1]:{both.port}/v1/models").status_code == 200
    assert httpx.get(f"http://127.0.0.1:{both.port}/v1/models").status_code == 200


def test_bind_addresses():
    from openai_ext.core.config import Settings
    from openai_ext.core.server import bind_addresses

    assert bind_addresses(Settings()) == ["127.0.0.1"]
    assert bind_addresses(Settings(ipv6=True)) == ["127.0.0.1", "::1"]
    assert bind_addresses(Settings(listen=True, ipv6=True)) == ["0.0.0.0", "::"]
    # one dual-stack socket, which serves IPv4 as well
    assert bind_addresses(Settings(listen=True, listen_host="::", ipv6=True)) == ["::"]
    assert bind_addresses(Settings(listen_host="0.0.0.0")) == ["127.0.0.1"]            # listen is off
    # the tunnel forwards to 127.0.0.1: it is bound whenever the tunnel is on
    assert bind_addresses(Settings(listen=True, listen_host="::1", public_api=True)) == ["::1", "127.0.0.1"]
    assert bind_addresses(Settings(listen=True, listen_host="10.1.2.3", public_api=True)) == ["10.1.2.3", "127.0.0.1"]
    for host in ("0.0.0.0", "::", "127.0.0.1"):
        assert bind_addresses(Settings(listen=True, listen_host=host, public_api=True)) == [host]


def test_json_body_over_the_limit_is_413(scripted_host, make_server):
    small = make_server(scripted_host, max_body_mb=0.01)   # about 10 kB
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


def test_upload_routes_have_the_upload_limit(scripted_host, make_server):
    server = make_server(scripted_host, max_upload_mb=0.05, max_body_mb=1)
    files = {"file": ("a.wav", b"\0" * 200_000, "audio/wav")}
    r = httpx.post(server.url + "/audio/transcriptions", data={"model": "whisper-1"}, files=files, timeout=30)
    assert r.status_code == 413 and "max_upload_mb" in r.json()["error"]["message"]
