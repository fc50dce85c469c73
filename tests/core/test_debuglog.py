"""--debug shows what a user needs to see why a request was refused: each body (secrets hidden,
long texts cut) and each error's message; stream chunks only at the second level."""

from __future__ import annotations

import logging

import httpx

from openai_ext.core.debuglog import redact


def test_redact_hides_secrets_and_cuts_long_texts():
    body = {"api_key": "sk-123", "messages": [{"role": "user", "content": "x" * 500}] * 30,
            "metadata": {"Authorization": "Bearer abc", "tokens": 5}}
    out = redact(body)
    assert out["api_key"] == "***" and out["metadata"]["Authorization"] == "***"
    assert out["messages"][0]["content"].startswith("x" * 200) and "(+300 chars)" in out["messages"][0]["content"]
    assert len(out["messages"]) == 21 and out["messages"][-1] == "...(+10 items)"


def test_only_secrets_are_hidden_not_token_counts():
    body = {"api_key": "a", "admin_key": "b", "x-api-key": "c", "apiKey": "d", "key": "e", "access_token": "f",
            "token": "g", "client_secret": "h", "password": "i", "Cookie": "j", "authToken": "k",
            "max_tokens": 16, "max_completion_tokens": 32, "max_output_tokens": 64, "max_new_tokens": 8,
            "top_logprobs": 2, "prompt_cache_key": "thread-1", "logit_bias": {"50256": -100}}
    out = redact(body)
    assert [k for k, v in out.items() if v == "***"] == list(body)[:11]
    assert {k: out[k] for k in list(body)[11:]} == {k: body[k] for k in list(body)[11:]}


def test_debug_logs_bodies_and_error_messages_but_not_stream_chunks(scripted_host, make_server, caplog):
    caplog.set_level(logging.DEBUG)
    server = make_server(scripted_host, debug=True)
    try:
        r = httpx.post(f"{server.url}/chat/completions", timeout=60, json={
            "model": "x", "messages": [{"role": "user", "content": "Say hi. " + "y" * 400}],
            "max_tokens": 3, "stream": True, "password": "hunter2"})
        assert r.status_code == 400   # 'password' is not a parameter
        bodies = [m for m in caplog.messages if m.startswith("POST /v1/chat/completions: {")]
        assert len(bodies) == 1 and "***" in bodies[0] and "hunter2" not in bodies[0] and "(+" in bodies[0]
        assert any(m.startswith("answered 400 invalid_request_error (param password)") for m in caplog.messages)
        caplog.clear()
        r = httpx.post(f"{server.url}/chat/completions", timeout=60, json={
            "model": "x", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5, "stream": True})
        assert r.status_code == 200 and r.text.count("data: {") >= 2
        assert not [rec for rec in caplog.records if rec.name.startswith("sse_starlette")]
    finally:
        server.stop()
        make_server(scripted_host)   # puts the loggers back as a server without debug sets them


def test_debug_streams_logs_every_chunk(scripted_host, make_server, caplog):
    caplog.set_level(logging.DEBUG)
    server = make_server(scripted_host, debug=True, debug_streams=True)
    try:
        r = httpx.post(f"{server.url}/chat/completions", timeout=60, json={
            "model": "x", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5, "stream": True})
        assert r.status_code == 200
        assert [rec for rec in caplog.records if rec.name.startswith("sse_starlette")]
    finally:
        server.stop()
        make_server(scripted_host)
