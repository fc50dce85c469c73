"""Errors on the Messages routes: Anthropic's error object with Anthropic's statuses and types,
whether the error comes from a route, from validation, or from a guard before the app; and the
OpenAI routes keep OpenAI's shape."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient
from support.anthropic_types import anthropic_client, assert_error, parse_events
from support.spec import assert_valid

from openai_ext.app import ERROR_SHAPES
from openai_ext.core import errors
from openai_ext.core.handlers import install_error_handlers
from openai_ext.messages import errors as anthropic_errors

Q = [{"role": "user", "content": "Hi"}]
KEY = "sk-messages-test-123"
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello"}}


def post(server, body, path="/messages", **kw):
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


@pytest.mark.parametrize("body, says", [
    ({"model": "x", "messages": Q}, "'max_tokens'"),
    ({"model": "x", "messages": [], "max_tokens": 5}, "'messages'"),
    ({"messages": Q, "max_tokens": 5}, "'model'"),
    ({"model": "x", "messages": Q, "max_tokens": 0}, "max_tokens"),
    ({"model": "x", "messages": [{"role": "system", "content": "x"}], "max_tokens": 5}, "at least one user turn"),
    ({"model": "x", "messages": [*Q, {"role": "tool", "content": "x"}], "max_tokens": 5}, "messages[1].role"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "temperature": 1.5}, "temperature"),
    ({"model": "x", "messages": [{"role": "user", "content": [IMAGE]}], "max_tokens": 5},
     "messages[0].content[0] is an image, and the loaded model has no vision. This model reads text only"),
    ({"model": "x", "messages": [{"role": "user", "content": [DOCUMENT]}], "max_tokens": 5}, "'document'"),
    ({"model": "x", "messages": [{"role": "user", "content": [{"type": "web_search_tool_result"}]}],
      "max_tokens": 5}, "web_search_tool_result"),
    ({"model": "x", "messages": Q, "max_token": 5, "max_tokens": 5}, "Did you mean 'max_tokens'"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "container": "c-1"}, "container"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "mcp_servers": [{"type": "url"}]}, "mcp_servers"),
    ({"model": "x", "messages": Q, "max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 10}},
     "budget_tokens"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "context_management": {"edits": [{"type": "compact_20260112"}]}},
     "compact_20260112"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "context_management": {"edits": [{"type": "clear_all"}]}},
     "clear_tool_uses_20250919 or clear_thinking_20251015"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "context_management": {"edits": [
        {"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}]}}, "must come first"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "context_management": {"edits": [
        {"type": "clear_tool_uses_20250919"}, {"type": "clear_tool_uses_20250919"}]}}, "give each type of edit once"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "context_management": {"edits": [
        {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}]}},
     "context_management.edits[0].keep.value"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "thread": {"type": "continue"}}, "thread.previous_message_id"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "thread": {"type": "fork"}}, "'create' or 'continue'"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "system": "s",
      "thread": {"type": "continue", "previous_message_id": "msg_1"}}, "system is kept by the thread"),
    ({"model": "x", "messages": Q, "max_tokens": 5, "tfs": 0.5}, "tfs"),   # a sampler this host lacks
    ({"model": "x", "max_tokens": 5, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "any"}, "messages": [*Q, {"role": "assistant", "content": "Sure: "}]}, "prefill"),
])
def test_bad_requests_get_anthropic_400s(scripted, body, says):
    r = post(scripted, body)
    assert r.status_code == 400, r.text
    assert_error(r.json(), "invalid_request_error")
    assert says in r.json()["error"]["message"] or says == "prefill", r.json()


def test_garbage_bodies_get_anthropic_400s(scripted):
    for content in (b"{not json", b"[1, 2]", b""):
        r = httpx.post(scripted.url + "/messages", content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert_error(r.json(), "invalid_request_error")


def test_sdk_raises_its_own_error_classes(scripted):
    claude = anthropic_client(scripted)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": [IMAGE]}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.get("/v1/messages/batches/x", cast_to=object)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model="x", messages=[])


def test_unknown_paths_and_methods_under_messages(scripted):
    r = httpx.get(scripted.url + "/messages/batches")
    assert r.status_code == 404
    assert_error(r.json(), "not_found_error")
    r = httpx.get(scripted.url + "/messages")
    assert r.status_code == 405
    assert_error(r.json(), "invalid_request_error")


@pytest.fixture(scope="module")
def keyed(scripted_host, make_server):
    return make_server(scripted_host, api_key=KEY)


def test_keys_as_x_api_key_or_bearer(keyed):
    for sclaude in (anthropic_client(keyed, api_key=KEY),                        # x-api-key
                   anthropic.Anthropic(base_url=keyed.url.removesuffix("/v1"), auth_token=KEY, max_retries=0,
                                       _strict_response_validation=True)):   # Authorization: Bearer
        assert sclaude.messages.create(model="x", max_tokens=2, messages=Q).usage.output_tokens == 2
        assert sclaude.messages.count_tokens(model="x", messages=Q).input_tokens > 0
        assert sclaude.models.list().data
    # the OpenAI routes take either header as well
    assert httpx.get(keyed.url + "/models", headers={"x-api-key": KEY}).status_code == 200


def test_a_wrong_key_is_an_anthropic_401_before_the_body_is_read(keyed):
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic_client(keyed, api_key="wrong").messages.create(model="x", max_tokens=2, messages=Q)
    assert_error(e.value.body, "authentication_error")
    assert "x-api-key" in e.value.body["error"]["message"]
    r = httpx.post(keyed.url + "/messages", content=b"{not json", headers={"x-api-key": "wrong"})
    assert r.status_code == 401
    assert_error(r.json(), "authentication_error")
    r = httpx.get(keyed.url + "/models", headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 401
    assert_error(r.json(), "authentication_error")
    # the OpenAI routes answer as before
    r = httpx.get(keyed.url + "/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert_valid("ErrorResponse", r.json())


def test_a_body_over_the_limit_is_request_too_large(scripted_host, make_server):
    server = make_server(scripted_host, max_body_mb=0.01)
    big = [{"role": "user", "content": "x" * 20_000}]
    with pytest.raises(anthropic.RequestTooLargeError) as e:
        anthropic_client(server).messages.create(model="x", max_tokens=2, messages=big)
    assert e.value.status_code == 413
    assert_error(e.value.body, "request_too_large")


def test_a_foreign_host_header_is_refused_in_anthropics_shape(scripted):
    r = post(scripted, {"model": "x", "messages": Q, "max_tokens": 2}, headers={"Host": "evil.example"})
    assert r.status_code == 400
    assert_error(r.json(), "invalid_request_error")
    assert "evil.example" in r.json()["error"]["message"]


def test_a_host_failure_is_an_api_error(scripted, failing_scripted):
    with pytest.raises(anthropic.InternalServerError) as e:
        anthropic_client(scripted).messages.create(model="x", max_tokens=20, messages=Q)
    assert e.value.status_code == 500
    assert_error(e.value.body, "api_error")
    assert "simulated" not in e.value.body["error"]["message"]


def test_a_failure_mid_stream_is_an_error_event(scripted, failing_scripted):
    failing_scripted["after"] = 3
    r = post(scripted, {"model": "x", "messages": Q, "max_tokens": 20, "stream": True})
    events = parse_events(r.text)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and "content_block_delta" in names and names[-1] == "error"
    assert_error(events[-1][1], "api_error")
    with pytest.raises(anthropic.APIStatusError) as e:     # the SDK raises it from the stream
        for _ in anthropic_client(scripted).messages.create(model="x", max_tokens=20, messages=Q, stream=True):
            pass
    assert_error(e.value.body, "api_error")
    failing_scripted["after"] = -1
    ok = anthropic_client(scripted).messages.create(model="x", max_tokens=3, messages=Q)
    assert ok.usage.output_tokens == 3


# Errors no request to the real server can provoke on these routes (nothing there checks a
# permission or a rate) still take Anthropic's shape and the status the SDK expects: a small app
# with the server's own error shapes raises each one.
@pytest.mark.parametrize("error, status, kind, sdk_class", [
    (errors.InvalidRequestError("bad"), 400, "invalid_request_error", anthropic.BadRequestError),
    (errors.AuthenticationError(), 401, "authentication_error", anthropic.AuthenticationError),
    (errors.PermissionDeniedError("no"), 403, "permission_error", anthropic.PermissionDeniedError),
    (errors.NotFoundError("none"), 404, "not_found_error", anthropic.NotFoundError),
    (errors.RequestTooLargeError("big"), 413, "request_too_large", anthropic.RequestTooLargeError),
    (errors.RateLimitError("slow down"), 429, "rate_limit_error", anthropic.RateLimitError),
    (errors.RateLimitError("full", code="queue_full"), 529, "overloaded_error", anthropic.OverloadedError),
    (errors.ServerError("boom"), 500, "api_error", anthropic.InternalServerError),
    (errors.ServiceUnavailableError("no model"), 503, "api_error", anthropic.InternalServerError),
    (errors.UpstreamError("late", status=504), 504, "timeout_error", anthropic.InternalServerError),
])
def test_every_status_in_anthropics_shape(error, status, kind, sdk_class):
    app = FastAPI()
    install_error_handlers(app, ERROR_SHAPES)

    @app.post("/v1/messages")
    async def fail():
        raise error

    @app.post("/v1/chat/completions")
    async def fail_openai():
        raise error

    http = TestClient(app)
    claude = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=http, max_retries=0)
    with pytest.raises(sdk_class) as e:
        claude.messages.create(model="x", max_tokens=2, messages=Q)
    assert e.value.status_code == status
    assert_error(e.value.body, kind)
    assert anthropic_errors.reply(error).status == status
    openai_side = http.post("/v1/chat/completions")          # OpenAI's routes: OpenAI's shape
    assert openai_side.status_code == error.status and openai_side.json() == error.body()


def test_a_prompt_that_cannot_fit_names_a_longer_context_first(sclaude, scripted_host):
    long = "word " * (scripted_host.context_length() + 50)
    with pytest.raises(anthropic.BadRequestError) as e:
        sclaude.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": long}])
    assert_error(e.value.body, "invalid_request_error")
    message = e.value.body["error"]["message"]
    assert "--n-ctx" in message and "longer context" in message
    assert message.index("--n-ctx") < message.index("truncate_prompt"), message
