"""Bad input gets OpenAI's error object, with the right status and the parameter that is wrong."""

from __future__ import annotations

import httpx
import pytest
from support.responses_api import create
from support.spec import error_of

HI = {"role": "user", "content": "Hi"}
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}, "strict": True}


@pytest.mark.parametrize("body, status, param", [
    ({"input": [{"type": "telepathy", "content": "hi"}]}, 400, "input[0].type"),
    ({"input": [HI, {"type": "web_search_call", "id": "ws_1", "status": "completed"}]}, 400, "input[1].type"),
    ({"input": [{"content": "no role"}]}, 400, "input[0].type"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, 400, "input[0].role"),
    ({"input": [{"role": "user", "content": "hi", "colour": "blue"}]}, 400, "input[0].colour"),
    ({"input": [HI, {"type": "function_call_output", "call_id": "call_nowhere", "output": "42"}]}, 400,
     "input[1].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"}]}]},
     400, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, 400, "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_nowhere"}]}, 404, "input[0].id"),
    ({"input": "Hi", "previous_response_id": "resp_nowhere"}, 404, "previous_response_id"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, 400, "tools[0]"),
    ({"input": "Hi", "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, 400, "tools[0]"),
    ({"input": "Hi", "tools": [{"type": "mcp", "server_label": "x", "server_url": "https://x"}]}, 400,
     "tools[0].server_url"),
    ({"input": "Hi", "tools": [TOOL], "tool_choice": {"type": "file_search"}}, 400, "tool_choice"),
    ({"input": "Hi", "tools": [{**TOOL, "name": "bad name!"}]}, 400, "tools[0].name"),
    ({"input": "Hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "g"}}, 400, "tool_choice"),
    ({"input": "Hi", "text": {"format": {"type": "xml"}}}, 400, "text.format.type"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
    ({"input": "Hi", "max_output_tokens": 5}, 400, "max_output_tokens"),
    ({"input": "Hi", "temperature": 3}, 400, "temperature"),
    ({"input": "Hi", "top_logprobs": 21}, 400, "top_logprobs"),
    ({"input": "Hi", "include": ["everything"]}, 400, "include[0]"),
    ({"input": "Hi", "max_tokens": 20}, 400, "max_tokens"),
    ({"input": "Hi", "messages": [HI]}, 400, "messages"),
    ({"input": "Hi", "frobnicate": 1}, 400, "frobnicate"),
    ({"input": "Hi", "prompt": {"id": "pmpt_1"}}, 400, "prompt"),
    ({"input": "Hi", "context_management": [{"type": "summary"}]}, 400, "context_management[0].type"),
    ({"input": "Hi", "metadata": {str(i): "v" for i in range(17)}}, 400, "metadata"),
    ({"input": []}, 400, "input"),
    ({}, 400, "input"),
])
def test_bad_requests_name_what_is_wrong(srserver, body, status, param):
    err = error_of(httpx.post(f"{srserver.url}/responses", json={"model": "x", **body}, timeout=60), status)
    assert err["param"] == param, err
    assert err["message"] and err["type"] == "invalid_request_error"


def test_a_hosted_tool_is_named_in_the_message(srserver):
    err = error_of(httpx.post(f"{srserver.url}/responses", json={"input": "Hi", "tools": [{"type": "web_search"}]}), 400)
    assert "'web_search'" in err["message"] and "hosted" in err["message"]


def test_an_unknown_field_is_refused_as_in_chat(srserver):
    err = error_of(httpx.post(f"{srserver.url}/responses", json={"input": "Hi", "max_output_token": 20}), 400)
    assert err["code"] == "unknown_parameter" and "Did you mean 'max_output_tokens'?" in err["message"]
    err = error_of(httpx.post(f"{srserver.url}/responses", json={"input": "Hi", "max_tokens": 20}), 400)
    assert "max_output_tokens" in err["message"]


def test_input_longer_than_the_context(srserver, srclient, scripted_host):
    long = "word " * (scripted_host.context_length() + 50)
    err = error_of(httpx.post(f"{srserver.url}/responses", json={"input": long, "max_output_tokens": 16}), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "input"
    assert str(scripted_host.context_length()) in err["message"] and "truncation" in err["message"]
    # a longer context first; truncation, which drops the oldest input items, only after it
    assert "--n-ctx" in err["message"] and err["message"].index("--n-ctx") < err["message"].index("truncation")
    assert "truncate_prompt" not in err["message"]
    # truncation auto drops the oldest items until the rest fits
    items = [{"role": "user", "content": long}, {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": "Say hi."}]
    resp, body = create(srclient, input=items, truncation="auto", max_output_tokens=16)
    assert body["truncation"] == "auto" and resp.usage.input_tokens < 100


def test_errors_of_stored_objects(srserver):
    for method, path in (("GET", "/responses/resp_nowhere"), ("DELETE", "/responses/resp_nowhere"),
                         ("POST", "/responses/resp_nowhere/cancel"), ("GET", "/responses/resp_nowhere/input_items"),
                         ("GET", "/conversations/conv_nowhere"), ("DELETE", "/conversations/conv_nowhere")):
        err = error_of(httpx.request(method, srserver.url + path), 404)
        assert "not found" in err["message"]


def test_storage_switched_off(scripted_host, make_server, tmp_path):
    server = make_server(scripted_host, responses_store=False, data_dir=str(tmp_path / "never"))
    r = httpx.post(f"{server.url}/responses", json={"input": "Say hi.", "max_output_tokens": 16}, timeout=60)
    assert r.status_code == 200 and r.json()["store"] is False
    error_of(httpx.get(f"{server.url}/responses/{r.json()['id']}"), 400)
    err = error_of(httpx.post(f"{server.url}/responses", json={"input": "Hi", "previous_response_id": "resp_1"}), 400)
    assert err["param"] == "previous_response_id"
    error_of(httpx.post(f"{server.url}/conversations", json={}), 400)
    assert not (tmp_path / "never").exists()   # nothing was stored, not even an empty database
