"""Responses' mcp tool against a real MCP server (the official SDK's, tests/support/mcp_servers.py):
listing (and reusing the list in a chain), forced and chained calls, approvals granted and
declined (chained and stateless), a tool's error, a hanging server, refused hosts, credentials
kept out of every body, streaming, background and the WebSocket. The replies are scripted (the
model's part is not the subject); one test runs the real model."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support.mcp_servers import FrozenServer, mcp_tool, start_demo_server
from support.responses_api import create, poll, stream_raw
from support.scripted import call, forced
from support.servers import openai_client
from support.spec import assert_valid, error_of

pytest.importorskip("mcp")

ADD = {"type": "mcp", "server_label": "demo", "name": "add"}


def post(server, path="/responses", **body):
    return httpx.post(f"{server.url}{path}", json={"model": "x", **body}, timeout=60)


@pytest.fixture(scope="module")
def demo():
    server = start_demo_server()
    yield server
    server.stop()


@pytest.fixture
def mcp_server(demo):
    demo.reset()
    return demo


@pytest.fixture(scope="module")
def allowed(scripted_host, make_server, tmp_path_factory):
    """A server on the scripted host that may call MCP servers on 127.0.0.1 (any port)."""
    return make_server(scripted_host, data_dir=str(tmp_path_factory.mktemp("mcp-data")), mcp_allow=["127.0.0.1"],
                       mcp_timeout=60.0, mcp_max_calls=3, mcp_max_result_bytes=1000)


@pytest.fixture(scope="module")
def hasty(scripted_host, make_server):
    """The same with a 2 s deadline, for the tests whose subject it is (elsewhere a loaded machine
    can take 2 s to list a healthy server's tools)."""
    return make_server(scripted_host, mcp_allow=["127.0.0.1"], mcp_timeout=2.0, mcp_max_calls=3,
                       mcp_max_result_bytes=1000)


@pytest.fixture(scope="module")
def patient(scripted_host, make_server):
    """The same, with a deadline no loaded machine reaches (the call's length is the test's)."""
    return make_server(scripted_host, mcp_allow=["127.0.0.1"], mcp_timeout=600, debug=True)


@pytest.fixture
def mclient(allowed, script):
    return openai_client(allowed)


def prompts(host) -> list[str]:
    return [c.prompt.text for c in host.calls]


def test_a_forced_call_runs_and_the_model_answers_from_its_result(mclient, mcp_server, script, scripted_host):
    script.script(forced({"a": 2, "b": 3}), "Two and three make 5.")
    resp, body = create(mclient, input="What is 2 + 3?", tools=[mcp_tool(mcp_server)], tool_choice=ADD)
    assert [it["type"] for it in body["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    listed, made, answer = body["output"]
    assert {t["name"] for t in listed["tools"]} == {"add", "echo", "fail", "wait"}
    add = next(t for t in listed["tools"] if t["name"] == "add")
    assert add["input_schema"]["required"] == ["a", "b"] and add["annotations"] == {"readOnlyHint": True}
    assert made["server_label"] == "demo" and made["name"] == "add" and json.loads(made["arguments"]) == {"a": 2, "b": 3}
    assert made["output"] == "5" and made["error"] is None and made["status"] == "completed"
    assert made["id"].startswith("mcp_") and listed["id"].startswith("mcpl_")
    assert resp.status == "completed" and resp.output_text == "Two and three make 5."
    assert mcp_server.calls == [("add", {"a": 2, "b": 3})]
    # the second pass read the result; both passes are in the usage
    first, second = scripted_host.calls[-2:]
    assert "5" in second.prompt.text.split("What is 2 + 3?")[1]
    assert body["usage"]["input_tokens"] == len(first.prompt.tokens) + len(second.prompt.tokens)
    assert body["tool_choice"] == ADD
    [echoed] = body["tools"]
    assert echoed["type"] == "mcp" and echoed["headers"] is None and echoed["require_approval"] == "never"


def test_two_calls_in_a_chain_then_an_answer(mclient, mcp_server, script):
    script.script(call("add", {"a": 20, "b": 22}), call("echo", {"text": "42"}), "The answer is 42.")
    _, body = create(mclient, input="Add 20 and 22, then echo it.", tools=[mcp_tool(mcp_server)])
    assert [it["type"] for it in body["output"]] == ["mcp_list_tools", "mcp_call", "mcp_call", "message"]
    assert [it.get("output") for it in body["output"][1:3]] == ["42", "echo: 42"]
    assert mcp_server.calls == [("add", {"a": 20, "b": 22}), ("echo", {"text": "42"})]


def test_a_pass_that_also_calls_a_client_function_ends_for_its_answer(mclient, mcp_server, script):
    """The MCP call runs, and the response ends with the client's function_call to answer (the
    model cannot go on before it has that output)."""
    weather = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    script.script(call("add", {"a": 1, "b": 2}) + "\n" + call("get_weather", {"city": "Oslo"}))
    resp, body = create(mclient, input="Add, and the weather.", tools=[mcp_tool(mcp_server), weather])
    assert [it["type"] for it in body["output"]] == ["mcp_list_tools", "mcp_call", "function_call"]
    assert body["output"][1]["output"] == "3" and resp.status == "completed"
    script.script("It is 3, and sunny in Oslo.")
    _, body = create(mclient, previous_response_id=resp.id, tools=[mcp_tool(mcp_server), weather], input=[
        {"type": "function_call_output", "call_id": body["output"][2]["call_id"], "output": "sunny"}])
    assert [it["type"] for it in body["output"]] == ["message"]


def test_the_list_is_reused_by_a_follow_up(mclient, mcp_server, script):
    script.script(forced({"a": 1, "b": 1}), "2.", forced({"a": 2, "b": 2}), "4.")
    first, _ = create(mclient, input="1+1?", tools=[mcp_tool(mcp_server)], tool_choice=ADD)
    _, body = create(mclient, input="2+2?", previous_response_id=first.id, tools=[mcp_tool(mcp_server)],
                     tool_choice=ADD)
    assert [it["type"] for it in body["output"]] == ["mcp_call", "message"]
    assert mcp_server.calls == [("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2})]


def test_a_chain_with_calls_compacts(mclient, allowed, mcp_server, script, scripted_host):
    script.script(forced({"a": 4, "b": 4}), "8.")
    first, _ = create(mclient, input="4+4?", tools=[mcp_tool(mcp_server)], tool_choice=ADD)
    script.script("The user asked for 4+4; the add tool said 8.")
    r = post(allowed, previous_response_id=first.id, path="/responses/compact")
    assert r.status_code == 200, r.text
    assert_valid("CompactResource", r.json())
    assert r.json()["output"][-1]["type"] == "compaction"
    assert "demo.add" in scripted_host.calls[-1].prompt.text and "returned: 8" in scripted_host.calls[-1].prompt.text


def test_allowed_tools_limit_what_is_listed_and_offered(mclient, mcp_server, script, scripted_host):
    script.script("No tools needed.")
    _, body = create(mclient, input="Hello", tools=[mcp_tool(mcp_server, allowed_tools=["add"])])
    assert [t["name"] for t in body["output"][0]["tools"]] == ["add"]
    prompt = scripted_host.calls[-1].prompt.text
    assert '"add"' in prompt and '"echo"' not in prompt
    script.script("Still none.")
    _, body = create(mclient, input="Hello", tools=[mcp_tool(mcp_server, allowed_tools={"read_only": True})])
    assert [t["name"] for t in body["output"][0]["tools"]] == ["add"]


def test_approval_granted_after_previous_response_id(mclient, mcp_server, script):
    script.script(call("echo", {"text": "hi"}))
    tool = mcp_tool(mcp_server, require_approval="always")
    first, body = create(mclient, input="Say hi through the echo tool.", tools=[tool])
    assert [it["type"] for it in body["output"]] == ["mcp_list_tools", "mcp_approval_request"]
    request = body["output"][1]
    assert request["name"] == "echo" and json.loads(request["arguments"]) == {"text": "hi"}
    assert first.status == "completed" and mcp_server.calls == []

    script.script("It said: echo: hi")
    _, body = create(mclient, previous_response_id=first.id, tools=[tool], input=[
        {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}])
    assert [it["type"] for it in body["output"]] == ["mcp_call", "message"]
    ran = body["output"][0]
    assert ran["approval_request_id"] == request["id"] and ran["output"] == "echo: hi"
    assert mcp_server.calls == [("echo", {"text": "hi"})]
    listed = mclient.responses.input_items.with_raw_response.list(body["id"]).http_response.json()
    assert_valid("ResponseItemList", listed)
    [answer] = listed["data"]
    assert answer["type"] == "mcp_approval_response" and answer["approve"] is True and answer["id"]


def test_approval_declined_tells_the_model(mclient, mcp_server, script, scripted_host):
    script.script(call("echo", {"text": "hi"}))
    tool = mcp_tool(mcp_server, require_approval={"never": {"tool_names": ["add"]}})
    first, body = create(mclient, input="Say hi.", tools=[tool])
    request = body["output"][-1]
    assert request["type"] == "mcp_approval_request"
    script.script("Understood, I will not.")
    _, body = create(mclient, previous_response_id=first.id, tools=[tool], input=[
        {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False,
         "reason": "not now"}])
    assert [it["type"] for it in body["output"]] == ["message"]
    assert mcp_server.calls == []
    assert "declined" in scripted_host.calls[-1].prompt.text and "not now" in scripted_host.calls[-1].prompt.text


def test_a_call_cut_by_max_output_tokens_asks_and_runs_nothing(mclient, mcp_server, script):
    for approval in ("always", "never"):
        script.script(call("echo", {"text": "a long text " * 20}))
        resp, body = create(mclient, input="Echo.", tools=[mcp_tool(mcp_server, require_approval=approval)],
                            max_output_tokens=16)
        assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
        kinds = [it["type"] for it in body["output"]]
        assert "mcp_approval_request" not in kinds
        assert all(it["status"] == "incomplete" for it in body["output"] if it["type"] == "mcp_call")
    assert mcp_server.calls == []


def test_approval_on_the_stateless_path(mclient, mcp_server, script):
    script.script(call("echo", {"text": "stateless"}))
    tool = mcp_tool(mcp_server, require_approval="always")
    ask = [{"role": "user", "content": "Echo 'stateless'."}]
    _, body = create(mclient, input=ask, tools=[tool], store=False)
    listed, request = body["output"]
    script.script("Done.")
    _, body = create(mclient, store=False, tools=[tool], input=[
        *ask, listed, request, {"type": "mcp_approval_response", "approval_request_id": request["id"],
                                "approve": True}])
    assert [it["type"] for it in body["output"]] == ["mcp_call", "message"]
    assert body["output"][0]["output"] == "echo: stateless"
    assert mcp_server.calls == [("echo", {"text": "stateless"})]


def test_an_answer_to_an_unknown_approval_request_is_a_400(allowed, mcp_server):
    err = error_of(post(allowed, tools=[mcp_tool(mcp_server)], input=[
        {"role": "user", "content": "hi"},
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}]), 400)
    assert err["param"] == "input[1].approval_request_id" and "mcpr_nope" in err["message"]


def test_a_tool_error_lands_in_the_call_and_the_model_goes_on(mclient, mcp_server, script, scripted_host):
    script.script(call("fail", {"reason": "testing"}), "The tool failed, sorry.")
    resp, body = create(mclient, input="Try the failing tool.", tools=[mcp_tool(mcp_server)])
    made = body["output"][1]
    assert made["status"] == "failed" and made["output"] is None
    assert made["error"]["type"] == "mcp_tool_execution_error" and made["error"]["content"]
    assert resp.status == "completed" and resp.output_text == "The tool failed, sorry."
    assert "Error:" in scripted_host.calls[-1].prompt.text


def test_a_hanging_server_fails_the_call_at_its_deadline(hasty, mcp_server, script):
    script.script(call("wait", {"seconds": 60}), "It timed out.")
    try:
        resp, body = create(openai_client(hasty), input="Wait.", tools=[mcp_tool(mcp_server)])
    finally:
        mcp_server.release.set()
    made = body["output"][1]
    assert made["status"] == "failed" and made["error"]["type"] == "http_error" and made["error"]["code"] == 504
    assert "mcp_timeout" in made["error"]["message"]
    assert resp.status == "completed" and resp.output_text == "It timed out."


def test_a_call_in_flight_holds_no_generation_slot(patient, mcp_server, script):
    """While the MCP server takes its time, another client's request is served (the slot is set
    aside for the call), and the response then goes on."""
    from concurrent.futures import ThreadPoolExecutor

    from support.servers import wait_until

    script.script(call("wait", {"seconds": 1}), "Chat reply.", "Waited.")
    mclient = openai_client(patient)
    assert patient.app.state.api.text.queue.capacity == 1   # one slot: only a slot set aside lets chat in
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(create, mclient, input="Wait.", tools=[mcp_tool(mcp_server)])
        wait_until(lambda: ("wait", {"seconds": 1}) in mcp_server.calls, "the call reached the MCP server")
        chat = mclient.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content == "Chat reply."
        assert not running.done()
        mcp_server.release.set()
        resp, body = running.result(timeout=60)
    assert body["output"][1]["output"] == "done waiting" and resp.output_text == "Waited."


def test_the_call_limit_ends_the_calls(mclient, mcp_server, script):
    """mcp_max_calls (3 here) across passes; max_tool_calls lowers it."""
    script.script("\n".join(call("add", {"a": i, "b": i}) for i in range(4)), "Enough.")
    _, body = create(mclient, input="Keep adding.", tools=[mcp_tool(mcp_server)])
    made = [it for it in body["output"] if it["type"] == "mcp_call"]
    assert [it["status"] for it in made] == ["completed"] * 3 + ["failed"]
    assert made[-1]["error"]["code"] == 429 and "mcp_max_calls" in made[-1]["error"]["message"]
    assert len(mcp_server.calls) == 3 and body["output"][-1]["type"] == "message"

    mcp_server.reset()
    script.script(call("add", {"a": 1, "b": 1}), call("add", {"a": 2, "b": 2}), "Done adding.")
    _, body = create(mclient, input="Keep adding.", tools=[mcp_tool(mcp_server)], max_tool_calls=2)
    assert [it["type"] for it in body["output"]] == ["mcp_list_tools", "mcp_call", "mcp_call", "message"]
    assert len(mcp_server.calls) == 2


def test_credentials_reach_the_server_and_nothing_else(mclient, mcp_server, script, allowed):
    script.script(forced({"a": 1, "b": 2}), "3")
    tool = mcp_tool(mcp_server, authorization="tok-secret-1", headers={"X-Tenant": "hdr-secret-2"})
    resp, body = create(mclient, input="1+2?", tools=[tool], tool_choice=ADD)
    seen = mcp_server.headers[-1]
    assert seen["authorization"] == "Bearer tok-secret-1" and seen["x-tenant"] == "hdr-secret-2"
    stored = httpx.get(f"{allowed.url}/responses/{resp.id}").text
    items = httpx.get(f"{allowed.url}/responses/{resp.id}/input_items").text
    for text in (json.dumps(body), stored, items):
        assert "secret-1" not in text and "secret-2" not in text


def test_a_result_over_the_size_limit_fails_the_call(mclient, mcp_server, script):
    script.script(call("echo", {"text": "x" * 1200}), "Too long.")
    _, body = create(mclient, input="Echo a lot.", tools=[mcp_tool(mcp_server)])
    made = body["output"][1]
    assert made["status"] == "failed" and made["output"] is None
    assert "mcp_max_result_bytes" in made["error"]["message"] and "1000" in made["error"]["message"]


def test_the_debug_log_hides_credentials(patient, mcp_server, script, caplog):
    script.script(forced({"a": 1, "b": 1}), "2")
    tool = mcp_tool(mcp_server, authorization="tok-secret-3", headers={"X-Tenant": "hdr-secret-4"})
    with caplog.at_level("DEBUG", logger="openai_ext"):   # (another server may have set it to INFO since)
        create(openai_client(patient), input="1+1?", tools=[tool], tool_choice=ADD)
    assert "demo" in caplog.text   # the body was logged
    assert "secret-3" not in caplog.text and "secret-4" not in caplog.text
    assert mcp_server.headers[-1]["authorization"] == "Bearer tok-secret-3"


def test_the_sse_transport(mclient, mcp_server, script):
    script.script(forced({"a": 5, "b": 6}), "11")
    _, body = create(mclient, input="5+6?", tools=[mcp_tool(mcp_server, server_url=mcp_server.sse_url)],
                     tool_choice=ADD)
    assert body["output"][1]["output"] == "11"


def test_a_streamed_response_tells_each_step(allowed, mcp_server, script):
    script.script(forced({"a": 3, "b": 4}), "Seven.")
    events = stream_raw(allowed, {"input": "3+4?", "tools": [mcp_tool(mcp_server)], "tool_choice": ADD})
    types = [e["type"] for e in events]
    expected = ["response.created", "response.in_progress", "response.output_item.added",
                "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed", "response.output_item.done",
                "response.output_item.added", "response.mcp_call_arguments.delta"]
    assert types[:len(expected)] == expected
    after = types[len(expected):]
    order = ["response.mcp_call_arguments.done", "response.mcp_call.in_progress", "response.mcp_call.completed",
             "response.output_item.done", "response.output_text.delta", "response.completed"]
    assert [after.index(t) for t in order] == sorted(after.index(t) for t in order)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[types.index("response.mcp_call.completed") + 1]["item"]
    assert done["type"] == "mcp_call" and done["output"] == "7"
    assert events[-1]["response"]["output"][1] == done


def test_a_background_response_runs_its_calls(mclient, mcp_server, script):
    script.script(forced({"a": 8, "b": 9}), "17")
    resp, _ = create(mclient, input="8+9?", tools=[mcp_tool(mcp_server)], tool_choice=ADD, background=True)
    body = poll(mclient, resp.id, lambda b: b["status"] not in ("queued", "in_progress"))
    assert body["status"] == "completed" and body["output"][1]["output"] == "17"


def test_over_the_websocket(patient, mcp_server, script):
    """(On the patient server: on a loaded machine a 2 s deadline can pass while the call runs.)"""
    from openai import AsyncOpenAI

    script.script(forced({"a": 10, "b": 5}), "15")

    async def go():
        client = AsyncOpenAI(base_url=patient.url, api_key="dummy", max_retries=0)
        async with client.responses.connect() as connection:
            await connection.response.create(model="gpt-4o", input="10+5?", tools=[mcp_tool(mcp_server)],
                                             tool_choice=ADD)
            out = []
            while not out or out[-1]["type"] not in ("response.completed", "response.failed", "error"):
                out.append(json.loads(await connection.recv_bytes()))
                assert_valid("ResponsesServerEvent", out[-1])
        await client.close()
        return out

    events = asyncio.run(go())
    final = events[-1]["response"]
    assert [it["type"] for it in final["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    assert final["output"][1]["output"] == "15", final["output"][1]


@pytest.mark.parametrize("settings, url, why", [
    ({}, None, "--mcp-allow"),
    ({"mcp_allow": ["mcp.example.com"]}, None, "no mcp_allow pattern"),
    ({"mcp_allow": ["*"]}, None, "only a pattern without wildcards"),
    ({"mcp_allow": ["127.0.0.1"]}, "file:///etc/passwd", "http://"),
])
def test_a_server_the_settings_do_not_allow_is_refused_before_any_connection(
        scripted_host, make_server, demo, settings, url, why):
    demo.reset()
    server = make_server(scripted_host, **settings)
    tool = mcp_tool(demo, **({"server_url": url} if url else {}))
    r = httpx.post(f"{server.url}/responses", json={"model": "x", "input": "hi", "tools": [tool]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert_valid("ErrorResponse", r.json())
    assert err["param"] == "tools[0].server_url" and why in err["message"]
    assert demo.headers == []


def test_a_server_that_cannot_list_is_a_424_naming_it(allowed):
    err = error_of(post(allowed, input="hi", tools=[{"type": "mcp", "server_label": "gone", "require_approval": "never",
                                                     "server_url": "http://127.0.0.1:9/mcp"}]), 424)
    assert "'gone'" in err["message"] and err["param"] == "tools[0].server_url"


def test_a_frozen_server_fails_its_listing_at_the_deadline_and_nothing_else(hasty, mcp_server, script):
    """A server that takes the connection and never answers: the request that needs it gets its
    424 once mcp_timeout has passed, naming it; a request beside it is served meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    frozen = FrozenServer()
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(post, hasty, input="hi", tools=[
                {"type": "mcp", "server_label": "frozen", "server_url": frozen.url, "require_approval": "never"}])
            script.script("Served.")
            assert create(openai_client(hasty), input="Hello")[0].output_text == "Served."
            err = error_of(waiting.result(timeout=60), 424)
    finally:
        frozen.close()
    assert "'frozen'" in err["message"] and "mcp_timeout" in err["message"]


def test_a_server_stopped_then_started_again(allowed, script):
    """Stopped after its tools were listed: the call fails in its item (the response completes);
    started again on its address: the next call runs, nothing to reset here."""
    own = start_demo_server()
    port = int(own.url.rsplit(":", 1)[1].split("/")[0])
    client = openai_client(allowed)
    try:
        script.script(forced({"a": 1, "b": 1}), "2.")
        first, _ = create(client, input="1+1?", tools=[mcp_tool(own)], tool_choice=ADD)
        own.stop()
        script.script(forced({"a": 2, "b": 2}), "It failed.")
        second, body = create(client, input="2+2?", previous_response_id=first.id, tools=[mcp_tool(own)],
                              tool_choice=ADD)
        made = body["output"][0]
        assert made["status"] == "failed" and made["error"]["type"] == "http_error" and made["error"]["code"] == 502
        assert second.status == "completed"
        again = start_demo_server(port)
        script.script(forced({"a": 3, "b": 3}), "6.")
        _, body = create(client, input="3+3?", previous_response_id=second.id, tools=[mcp_tool(again)],
                         tool_choice=ADD)
        assert body["output"][0]["output"] == "6" and again.calls == [("add", {"a": 3, "b": 3})]
        again.stop()
    finally:
        own.stop()


@pytest.mark.parametrize("tool, param", [
    ({"type": "mcp", "server_label": "x y", "server_url": "http://127.0.0.1:1/mcp"}, "tools[0].server_label"),
    ({"type": "mcp", "server_label": "d", "connector_id": "connector_gmail"}, "tools[0].server_url"),
    ({"type": "mcp", "server_label": "d"}, "tools[0].server_url"),
    ({"type": "mcp", "server_label": "d", "server_url": "http://127.0.0.1:1/mcp", "require_approval": "sometimes"},
     "tools[0].require_approval"),
    ({"type": "mcp", "server_label": "d", "server_url": "http://127.0.0.1:1/mcp", "allowed_tools": {"names": []}},
     "tools[0].allowed_tools"),
])
def test_a_malformed_mcp_tool_is_a_400_naming_the_field(allowed, tool, param):
    r = httpx.post(f"{allowed.url}/responses", json={"model": "x", "input": "hi", "tools": [tool]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_tool_choice_must_name_an_offered_mcp_tool(allowed, mcp_server):
    err = error_of(post(allowed, input="hi", tools=[mcp_tool(mcp_server, allowed_tools=["echo"])], tool_choice=ADD),
                   400)
    assert err["param"] == "tool_choice.name" and "echo" in err["message"]


@pytest.mark.slow
def test_the_real_model_makes_a_forced_call(llama_host, make_server, demo, tmp_path):
    demo.reset()
    server = make_server(llama_host, data_dir=str(tmp_path), mcp_allow=["127.0.0.1"])
    client = openai_client(server)
    resp, body = create(client, input="What is 19 plus 23? Use the add tool.", tools=[mcp_tool(demo)],
                        tool_choice=ADD, max_tool_calls=1, max_output_tokens=60)
    made = next(it for it in body["output"] if it["type"] == "mcp_call")
    args = json.loads(made["arguments"])
    assert made["status"] == "completed" and made["output"] == str(args["a"] + args["b"])
    assert demo.calls == [("add", args)]
    assert body["output"][-1]["type"] == "message" and resp.status in ("completed", "incomplete")
