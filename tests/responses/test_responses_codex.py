"""A request shaped as Codex CLI sends it (trimmed: Codex's instructions and environment text are
long, the test model's context is 2048 tokens): function tools beside a namespace tool, the
client_metadata OpenAI's spec does not have, prompt_cache_key, include, store false, reasoning,
text.verbosity, stream. Each turn is served while another client's ordinary request is served
beside it. Every stream event is validated against the spec."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
from openai.types.responses import Response
from support.responses_api import parse_events
from support.scripted import forced
from support.spec import assert_valid, error_of

EXEC = {"type": "function", "name": "exec_command", "strict": False,
        "description": "Runs a command in a shell and returns its output.",
        "parameters": {"type": "object", "properties": {
            "cmd": {"type": "string", "description": "The shell command to execute.", "maxLength": 60},
            "workdir": {"type": "string", "description": "The working directory.", "maxLength": 40}},
            "required": ["cmd"], "additionalProperties": False}}
PATCH = {"type": "function", "name": "apply_patch", "strict": False,
         "description": "Edits files with a patch in the apply_patch format.",
         "parameters": {"type": "object", "properties": {"input": {"type": "string", "maxLength": 200}},
                        "required": ["input"], "additionalProperties": False}}
PLAN = {"type": "function", "name": "update_plan", "strict": False,
        "description": "Updates the task plan shown to the user.",
        "parameters": {"type": "object", "properties": {
            "explanation": {"type": "string", "maxLength": 80},
            "plan": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
                "step": {"type": "string", "maxLength": 40},
                "status": {"enum": ["pending", "in_progress", "completed"]}},
                "required": ["step", "status"], "additionalProperties": False}}},
            "required": ["plan"], "additionalProperties": False}}
NAMESPACE = {"type": "namespace", "name": "workspace", "description": "Tools in the workspace namespace.",
             "tools": [EXEC, PATCH]}
ASK = "List the files in the current folder with a shell command."


def codex_request(input_items: list[dict], **changes) -> dict:
    """The body Codex CLI sends, trimmed; greedy decoding so the test model's choice repeats."""
    body = {
        "model": "gpt-5.1-codex",
        "instructions": "You are Codex, a coding assistant that runs in the user's terminal. Use the tools.",
        "input": input_items,
        # Codex's default web search (cached pages only) comes along: accepted, never offered
        "tools": [PLAN, NAMESPACE, {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a6d2-6a43-7c12-9b0e-3f8e1c2d4b5a",
        "text": {"verbosity": "low"},
        "client_metadata": {"thread_id": "0199a6d2-6a43-7c12-9b0e-3f8e1c2d4b5a",
                            "x-codex-turn-metadata": json.dumps({"turn_id": "0199a6d2-6a50-7d11-8a0f-0a1b2c3d4e5f"}),
                            "x-codex-installation-id": "8c7e2f0a-1b2c-4d3e-9f80-123456789abc"},
        "temperature": 0,
        "max_output_tokens": 400,
    }
    return {**body, **changes}


FIRST_INPUT = [
    {"type": "message", "id": "msg_0199a6d2-6a43-7c12-9b0e-000000000001", "role": "developer",
     "content": [{"type": "input_text", "text": "<permissions instructions>Commands may only read files.</permissions "
                                                "instructions>"}]},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "<environment_context><cwd>/home/user/project</cwd>"
                                                "</environment_context>"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]},
]


def post_stream(server, body: dict) -> list[dict]:
    """The request as Codex sends it (raw JSON: client_metadata is in no SDK type); the events,
    each validated, and the final Response parsed by the openai SDK's own type."""
    r = httpx.post(f"{server.url}/responses", json=body, headers={"Authorization": "Bearer dummy"}, timeout=120)
    assert r.status_code == 200, r.text
    events = parse_events(r.text)
    Response.model_validate(events[-1]["response"])
    return events


def ordinary(sclient) -> str:
    """Another client's plain request, served beside the Codex one."""
    raw = sclient.responses.with_raw_response.create(model="gpt-4o", input="Name a colour.", max_output_tokens=20,
                                                    temperature=0)
    body = raw.http_response.json()
    assert_valid("Response", body)
    return raw.parse().status


def beside(server, sclient, body: dict) -> list[dict]:
    with ThreadPoolExecutor(2) as pool:
        codex = pool.submit(post_stream, server, body)
        other = pool.submit(ordinary, sclient)
        events = codex.result(timeout=300)
        assert other.result(timeout=300) in ("completed", "incomplete")
    return events


def test_a_codex_request_calls_a_namespaced_function_and_takes_its_output(rserver, rclient):
    events = beside(rserver, rclient, codex_request(FIRST_INPUT, tool_choice="required"))
    final = events[-1]
    assert final["type"] == "response.completed", final
    response = final["response"]
    assert response["store"] is False and response["prompt_cache_key"] == "0199a6d2-6a43-7c12-9b0e-3f8e1c2d4b5a"
    assert response["tools"][1]["type"] == "namespace" and response["tools"][1]["tools"][0]["name"] == "exec_command"
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    # every call names its function by its own name, with its namespace where it has one
    assert {(c.get("namespace"), c["name"]) for c in calls} <= {(None, "update_plan"), ("workspace", "exec_command"),
                                                                 ("workspace", "apply_patch")}, calls
    call = next(c for c in calls if "namespace" in c)   # the model called a namespaced function
    # ... in every event that carries the call
    added = next(e["item"] for e in events if e["type"] == "response.output_item.added"
                 and e["item"]["id"] == call["id"])
    assert (added["namespace"], added["name"]) == (call["namespace"], call["name"])
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done"
                and e["item_id"] == call["id"])
    assert done["name"] == call["name"] and done["arguments"] == call["arguments"]
    member = EXEC if call["name"] == "exec_command" else PATCH
    jsonschema.validate(json.loads(call["arguments"]), member["parameters"])

    # the next turn, as Codex sends it with store false: the history, the call with its
    # namespace, and its output
    # (every call made, each with its output; a namespaced one with its namespace)
    sent = [{k: c[k] for k in ("type", "name", "namespace", "arguments", "call_id") if k in c} | {"status": "completed"}
            for c in calls]
    outputs = [{"type": "function_call_output", "call_id": c["call_id"], "status": "completed",
                "output": "README.md\nsetup.py\nsrc"} for c in calls]
    history = [*FIRST_INPUT, *sent, *outputs]
    events = beside(rserver, rclient, codex_request(history))
    final = events[-1]
    assert final["type"] in ("response.completed", "response.incomplete")
    answer = final["response"]
    assert answer["output"] and all(item["type"] in ("message", "function_call") for item in answer["output"])
    assert all(item.get("namespace") == "workspace" for item in answer["output"]
               if item["type"] == "function_call" and item["name"] != "update_plan")
    # the call and its output were read: the prompt holds them
    assert answer["usage"]["input_tokens"] > response["usage"]["input_tokens"]


def test_the_namespaced_call_is_shown_to_the_model_as_it_was_made(srserver):
    """The call sent back with its namespace counts as many prompt tokens as the same call made
    by a top-level function of that name: the model sees the name it called."""
    call = {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd":"ls"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "README.md"}

    def count(tools, sent):
        r = httpx.post(f"{srserver.url}/responses/input_tokens", json={
            "model": "x", "input": [{"role": "user", "content": ASK}, sent, output], "tools": tools}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    namespaced = count([NAMESPACE], {**call, "namespace": "workspace"})
    flat = count([{**f, "description": f"{NAMESPACE['description']} {f['description']}"} for f in (EXEC, PATCH)], call)
    assert namespaced == flat


def test_tool_choice_names_a_namespaced_function(srserver, script):
    """OpenAI's SDKs name a namespaced function namespace.name; the model's own name for it and a
    name only one namespace holds are taken too. Each forces that function."""
    script.script(*[forced({"input": "*** Begin Patch\n*** End Patch"})] * 2)
    for name in ("workspace.apply_patch", "apply_patch"):
        r = httpx.post(f"{srserver.url}/responses", json=codex_request(
            FIRST_INPUT, stream=False, tool_choice={"type": "function", "name": name}), timeout=120)
        assert r.status_code == 200, r.text
        assert_valid("Response", r.json())
        [call] = r.json()["output"]
        assert (call["namespace"], call["name"]) == ("workspace", "apply_patch") and call["status"] == "completed"


def test_hosted_tools_and_clashes_are_refused_by_name(srserver):
    def refused(tools, **extra):
        r = httpx.post(f"{srserver.url}/responses", json={"model": "x", "input": "Hi", "tools": tools, **extra})
        return error_of(r, 400)

    # a web search of the live web is OpenAI's to run: refused, saying which one is accepted
    for scripted in ({"type": "web_search"}, {"type": "web_search", "external_web_access": True}):
        err = refused([PLAN, NAMESPACE, scripted])
        assert err["param"] == "tools[2]" and "'web_search'" in err["message"]
        assert "external_web_access false" in err["message"]
    err = refused([{**NAMESPACE, "tools": [EXEC, {"type": "custom", "name": "exec", "format": {"type": "text"}}]}])
    assert err["param"] == "tools[0].tools[1]" and "custom" in err["message"]
    other = {**NAMESPACE, "name": "remote"}
    err = refused([NAMESPACE, other], tool_choice={"type": "function", "name": "exec_command"})
    assert err["param"] == "tool_choice.name" and "workspace.exec_command" in err["message"]
    # a namespaced function's parameters are named where they were sent
    broken = {**NAMESPACE, "tools": [EXEC, {**PATCH, "parameters": {"type": "object", "properties": 3}}]}
    err = refused([PLAN, broken])
    assert err["param"].startswith("tools[1].tools[1].parameters"), err
