"""Validation failures as OpenAI errors: the parameter named, and a message that says what to send."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from openai_ext.core.errors import from_validation_errors
from openai_ext.text.protocol import ChatCompletionRequest, CompletionRequest

USER = [{"role": "user", "content": "x"}]


def error_for(model, body):
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    # FastAPI reports body errors with a leading "body"
    return from_validation_errors([{**x, "loc": ("body", *x["loc"])} for x in e.value.errors()])


@pytest.mark.parametrize("model, body, param, says", [
    # a value no branch of a union takes: the accepted shapes, not the first branch's complaint
    (ChatCompletionRequest, {"messages": USER, "stop": 5}, "stop", "it must be a string or a list of strings"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content",
     "it must be a string or a list of content parts"),
    # a value one branch took in part: what is wrong inside it
    (ChatCompletionRequest, {"messages": USER, "stop": ["a"] * 5}, "stop", "at most 4 items"),
    (CompletionRequest, {"prompt": [[]]}, "prompt", "at least 1 item"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content",
     "a required field is missing: 'text'"),
    # no union: pydantic's own words
    (ChatCompletionRequest, {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "'user'"),
    (ChatCompletionRequest, {"messages": USER, "temperature": "hot"}, "temperature", "valid number"),
])
def test_messages_name_the_parameter_and_what_to_send(model, body, param, says):
    err = error_for(model, body)
    assert err.status == 400 and err.param == param and says in err.message, err.message
    assert "valid string" not in err.message or "valid string" in says


def test_missing_parameter():
    err = error_for(ChatCompletionRequest, {})
    assert err.param == "messages" and err.message == "Missing required parameter: 'messages'."


@pytest.mark.parametrize("path,body,param", [
    ("/completions", {"model": "x", "prompt": "hi", "logprobs": False}, "logprobs"),
    ("/completions", {"model": "x", "prompt": "hi", "max_tokens": True}, "max_tokens"),
    ("/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}], "top_p": False}, "top_p"),
    ("/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}], "temperature": True},
     "temperature"),
    ("/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}], "n": True}, "n"),
    ("/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}],
                           "logit_bias": {"42": True}}, "logit_bias"),
])
def test_booleans_are_not_numbers(scripted, path, body, param):
    r = httpx.post(f"{scripted.url}{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith(param) and "boolean" in err["message"]


def test_405_says_which_methods_are_allowed(scripted):
    r = httpx.get(f"{scripted.url}/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert "use POST" in r.json()["error"]["message"]


def test_the_openapi_document_lists_the_errors_the_server_really_sends(scripted):
    doc = httpx.get(scripted.url.removesuffix("/v1") + "/openapi.json").json()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert "422" not in codes, (method, path)
            assert {"400", "401", "404", "413", "429", "500"} <= codes, (method, path)
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert "text/event-stream" in chat and "application/json" in chat
    # and the 400 it documents is what a bad body gets
    r = httpx.post(f"{scripted.url}/chat/completions", json={"model": "x"})
    assert r.status_code == 400 and set(r.json()) == {"error"}
