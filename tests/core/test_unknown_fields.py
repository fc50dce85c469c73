"""Unknown request fields: a 400 naming the field on every OpenAI endpoint, as OpenAI answers, and
ignored when the allow_unknown_fields setting says so."""

from __future__ import annotations

import typing

import httpx
import openai
import pytest
from support.servers import openai_client
from support.spec import assert_valid

CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
BODIES = {
    "chat/completions": CHAT,
    "completions": {"prompt": "Once", "max_tokens": 2},
    "responses": {"input": "Once", "max_output_tokens": 16, "store": False},
    "embeddings": {"input": "a cat", "model": "text-embedding-3-small"},
    "moderations": {"input": "a friendly note"},
    "audio/speech": {"model": "tts-1", "voice": "alloy", "input": "Hi.", "response_format": "pcm"},
    "images/generations": {"prompt": "a cat"},
    "edits": {"instruction": "Fix the spelling.", "input": "helo", "model": "x"},
    "engines/local/completions": {"prompt": "Once", "max_tokens": 2},
}


@pytest.mark.parametrize("path", BODIES)
def test_an_unknown_field_is_a_400_naming_it(scripted, path):
    r = httpx.post(f"{scripted.url}/{path}", json={**BODIES[path], "frobnicate": 1}, timeout=60)
    assert r.status_code == 400, r.text
    assert_valid("ErrorResponse", r.json())
    err = r.json()["error"]
    assert err["param"] == "frobnicate" and err["code"] == "unknown_parameter"
    assert err["message"].startswith("Unrecognized request argument supplied: frobnicate.")


def test_a_misspelt_parameter_is_named_with_what_was_meant(sclient):
    with pytest.raises(openai.BadRequestError) as e:
        sclient.chat.completions.create(model="x", messages=CHAT["messages"], extra_body={"max_token": 5})
    assert e.value.body["param"] == "max_token" and "Did you mean 'max_tokens'?" in e.value.body["message"]


def test_the_first_unknown_field_in_the_body_is_the_one_named(scripted):
    for first, second in (("zeta", "alpha"), ("alpha", "zeta")):
        r = httpx.post(f"{scripted.url}/chat/completions", json={**CHAT, first: 1, second: 2}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == first, r.text


def test_web_ui_fields_and_host_samplers_are_not_unknown(scripted):
    r = httpx.post(f"{scripted.url}/chat/completions", timeout=60,
                   json={**CHAT, "mode": "instruct", "top_k": 20, "repetition_penalty": 1.1})
    assert r.status_code == 200, r.text


@pytest.mark.slow  # starts its own server
def test_the_setting_ignores_unknown_fields(scripted_host, make_server):
    server = make_server(scripted_host, allow_unknown_fields=True)
    for path in ("chat/completions", "moderations", "completions", "responses", "edits"):
        r = httpx.post(f"{server.url}/{path}", json={**BODIES[path], "frobnicate": 1}, timeout=60)
        assert r.status_code == 200, r.text
    # a request read on the prepare thread sees the setting too
    r = httpx.post(f"{server.url}/internal/logits", json={"prompt": "Once", "use_samplers": True, "frobnicate": 1},
                   timeout=60)
    assert r.status_code == 200, r.text
    reply = openai_client(server).chat.completions.create(model="x", messages=CHAT["messages"], max_tokens=2,
                                                          extra_body={"frobnicate": 1})
    assert reply.choices[0].finish_reason in ("length", "stop")


def test_one_check_for_every_family():
    """The same 400 whichever API asks: the first unknown name, with the API's own hint."""
    from openai_ext.core.errors import InvalidRequestError, refuse_unknown

    refuse_unknown([], known=["max_tokens"])
    refuse_unknown(["frobnicate"], allow=True)
    with pytest.raises(InvalidRequestError) as e:
        refuse_unknown(["max_token", "other"], known=["max_tokens", "model"])
    assert e.value.param == "max_token" and e.value.code == "unknown_parameter" and e.value.status == 400
    assert e.value.message.startswith("Unrecognized request argument supplied: max_token. Did you mean 'max_tokens'?")
    with pytest.raises(InvalidRequestError) as e:
        refuse_unknown(["stop"], known=["stream"], elsewhere={"stop": "It is a parameter of /v1/chat/completions."})
    assert "supplied: stop. It is a parameter of /v1/chat/completions." in e.value.message


def _routes(routes):
    for route in routes:
        inner = getattr(route, "original_router", None)   # FastAPI 0.165 includes routers lazily
        yield from _routes(inner.routes) if inner is not None else (route,)


def _body_models(app):
    """The pydantic models FastAPI reads each route's JSON body into."""
    from fastapi.routing import APIRoute
    from pydantic import BaseModel
    for route in _routes(app.routes):
        if isinstance(route, APIRoute) and route.body_field is not None:
            kind = route.body_field.field_info.annotation
            for k in (kind, *typing.get_args(kind)):
                if isinstance(k, type) and issubclass(k, BaseModel):
                    yield route.path, k


def test_every_route_body_is_an_api_model_that_refuses_unknown_fields(scripted):
    """One base model (core.api_model.ApiModel) refuses unknown fields by inheritance: no family's
    route takes a body whose check it could forget."""
    from openai_ext.core.api_model import ApiModel
    models = dict(_body_models(scripted.app))
    assert len(models) >= 20, models   # chat, completions, Responses, Messages, vector stores, batches ...
    assert {path for path, m in models.items() if not issubclass(m, ApiModel)} == set()
    # a nested ApiModel's unknown field is named at its place in the body
    r = httpx.post(f"{scripted.url}/vector_stores/vs_x/file_batches", timeout=60,
                   json={"files": [{"file_id": "file-1"}, {"file_id": "file-2", "colour": "red"}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "files[1].colour" and r.json()["error"]["code"] == "unknown_parameter"


def test_fields_openai_and_the_web_ui_document_are_not_unknown(scripted):
    """service_tier is taken (and ignored) on completions as on chat; the web UI's model-load
    body may carry its settings."""
    r = httpx.post(f"{scripted.url}/completions", json={**BODIES["completions"], "service_tier": "auto"}, timeout=60)
    assert r.status_code == 200, r.text
    from openai_ext.admin.routes import LoadModelRequest
    assert LoadModelRequest.model_validate({"model_name": "m", "settings": {"ctx_size": 4096}}).settings
