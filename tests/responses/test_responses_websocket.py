"""The Responses API over a WebSocket, as OpenAI documents it (the ResponsesClientEvent and
ResponsesServerEvent schemas): ``response.create`` events in, the stream's events out as
text frames, errors as ``error`` events with a status, the connection kept for the next request.
Driven by the Agents SDK's WebSocket transport and the openai SDK's ``responses.connect()``;
every frame is validated against the spec. The upgrade passes the same key, Host and browser
checks as an HTTP request."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import websockets
from openai import AsyncOpenAI
from support.hosts import FailingHost
from support.responses_api import create
from support.scripted import Reply, forced, held
from support.servers import openai_client, wait_until
from support.spec import assert_valid

from openai_ext.core.bodies import MAX_DEPTH

agents = pytest.importorskip("agents")


async def frames(connection, *, until=("response.completed", "response.incomplete", "response.failed", "error"),
                 count: int = 1) -> list[dict]:
    """The frames of ``count`` requests, each validated, up to each one's last event."""
    out, ended = [], 0
    while ended < count:
        event = json.loads(await connection.recv_bytes())
        assert_valid("ResponsesServerEvent", event)
        out.append(event)
        ended += event["type"] in until
    return out


def ws_client(server, **kw) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url, api_key=kw.pop("api_key", "dummy"), max_retries=0, **kw)


@pytest.mark.parametrize("namespaced, streamed", [(False, False), (True, True)])
def test_an_agent_runs_over_the_websocket_transport(srserver, script, namespaced, streamed):
    """Runner.run (and run_streamed) through the Agents SDK's WebSocket transport: a tool call,
    its output sent back on the same connection, and the answer; every response is stored and
    spec-valid. Namespaced: the tool in a tool_namespace(), named in tool_choice as the SDK
    names it (namespace.name), its call routed back to it by its namespace. The scripted host
    writes the forced call's arguments, and an answer once the call is no longer forced."""
    from agents.models.openai_provider import OpenAIProvider

    script.default = lambda prompt: forced({"city": "Paris"}) if prompt.text.endswith('"arguments": ') else \
        "It is sunny in Paris."

    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"It is sunny and 22 degrees in {city}."

    tools = [get_weather]
    choice = "get_weather"
    if namespaced:
        tools = agents.tool_namespace(name="weather", description="Weather tools.", tools=tools)
        choice = "weather.get_weather"

    async def go():
        client = ws_client(srserver)
        provider = OpenAIProvider(openai_client=client, use_responses=True, use_responses_websocket=True)
        settings = agents.ModelSettings(tool_choice=choice, temperature=0, max_tokens=60)
        agent = agents.Agent(name="Weather", instructions="Answer weather questions. Call get_weather first.",
                             tools=tools, model_settings=settings)
        config = agents.RunConfig(model_provider=provider, tracing_disabled=True)
        question = "What is the weather in Paris?"
        try:
            if streamed:
                result = agents.Runner.run_streamed(agent, question, max_turns=4, run_config=config)
                assert "raw_response_event" in [event.type async for event in result.stream_events()]
                return result
            return await agents.Runner.run(agent, question, max_turns=4, run_config=config)
        finally:
            await provider.aclose()
            await client.close()

    result = asyncio.run(go())
    assert len(calls) == 1 and calls[0].strip()
    assert [i.type for i in result.new_items] == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert getattr(result.new_items[0].raw_item, "namespace", None) == ("weather" if namespaced else None)
    client = openai_client(srserver)
    for raw in result.raw_responses:
        assert_valid("Response", client.responses.with_raw_response.retrieve(raw.response_id).http_response.json())


def test_requests_on_one_connection_and_an_http_client_beside_it(srserver):
    """Two response.create events on one connection, the second continuing the first; an error
    event for a bad one, after which the connection still serves; and a plain HTTP request
    served while the socket's response runs."""
    async def go():
        client = ws_client(srserver)
        async with client.responses.connect() as connection:
            await connection.response.create(model="gpt-4o", input="Name a colour.", max_output_tokens=20,
                                             temperature=0)
            with ThreadPoolExecutor(1) as pool:
                other = pool.submit(create, openai_client(srserver), input="Name a fruit.", max_output_tokens=20)
                first = await frames(connection)
                assert other.result(timeout=120)[0].status in ("completed", "incomplete")
            response = first[-1]["response"]
            await connection.send({"type": "response.create", "model": "gpt-4o", "input": "Hi",
                                   "max_output_tokens": 3})
            [error] = await frames(connection)
            await connection.response.create(model="gpt-4o", previous_response_id=response["id"],
                                             input="And another?", max_output_tokens=20, temperature=0)
            second = await frames(connection)
        await client.close()
        return first, response, error, second

    first, response, error, second = asyncio.run(go())
    assert [e["type"] for e in first[:2]] == ["response.created", "response.in_progress"]
    assert [e["sequence_number"] for e in first] == list(range(len(first)))
    assert first[-1]["type"] in ("response.completed", "response.incomplete") and response["output"]
    assert error["type"] == "error" and error["status"] == 400
    assert error["error"]["param"] == "max_output_tokens" and error["error"]["type"] == "invalid_request_error"
    final = second[-1]["response"]
    assert final["previous_response_id"] == response["id"]
    assert final["usage"]["input_tokens"] > response["usage"]["input_tokens"]


def test_lanes_by_stream_id(srserver):
    """Events carry the stream_id of the request they answer; a lane's requests are served in
    the order sent, and two lanes run side by side."""
    async def go():
        client = ws_client(srserver)
        async with client.responses.connect() as connection:
            for lane, word in (("a", "one"), ("b", "two"), ("a", "three")):
                await connection.send({"type": "response.create", "stream_id": lane, "model": "x",
                                       "input": f"Say {word}.", "max_output_tokens": 16, "temperature": 0})
            events = await frames(connection, count=3)
        await client.close()
        return events

    events = asyncio.run(go())
    created = [(e["stream_id"], e["response"]["id"]) for e in events if e["type"] == "response.created"]
    ended = [(e["stream_id"], e["response"]["id"]) for e in events if e["type"] == "response.completed"
             or e["type"] == "response.incomplete"]
    assert sorted(lane for lane, _ in created) == ["a", "a", "b"] and len(ended) == 3
    a_first, a_second = [rid for lane, rid in created if lane == "a"]
    # lane a's second response starts only after its first ended
    order = [e["response"]["id"] if "response" in e else None for e in events]
    assert order.index(a_second) > max(i for i, e in enumerate(events) if e.get("response", {}).get("id") == a_first
                                       and e["type"] != "response.created")
    assert all(e["stream_id"] in ("a", "b") for e in events)


def test_unsupported_events_get_a_clear_error(srserver):
    async def go():
        client = ws_client(srserver)
        async with client.responses.connect() as connection:
            await connection.send({"type": "response.create", "model": "x", "input": "Hi", "background": True})
            [background] = await frames(connection)
            await connection.send_raw("not json")
            [not_json] = await frames(connection)
            await connection.send_raw(json.dumps({"type": "response.cancel"}))
            [unknown] = await frames(connection)
        await client.close()
        return background, not_json, unknown

    background, not_json, unknown = asyncio.run(go())
    assert background["error"]["param"] == "background" and "POST /v1/responses" in background["error"]["message"]
    assert not_json["status"] == 400 and "JSON" in not_json["error"]["message"]
    assert unknown["error"]["param"] == "type" and "response.create" in unknown["error"]["message"]


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/responses"


def upgrade_refused(url: str, *, origin: str | None = None, host: str | None = None) -> tuple[int, dict]:
    """The status and error body of a refused upgrade; ``host``: the Host header to send (the
    connection still goes to the server's address)."""
    address = url.split("//", 1)[1].split("/", 1)[0]
    if host is not None:
        url = url.replace(address, f"{host}:{address.rsplit(':', 1)[1]}")
    connection = {"host": address.rsplit(":", 1)[0], "port": int(address.rsplit(":", 1)[1])} if host else {}

    async def go():
        with pytest.raises(websockets.exceptions.InvalidStatus) as caught:
            async with websockets.connect(url, origin=origin, **connection):
                pass
        response = caught.value.response
        return response.status_code, json.loads(response.body)

    return asyncio.run(go())


def test_the_upgrade_needs_the_key(scripted_host, make_server):
    server = make_server(scripted_host, api_key="sk-local", responses_store=False)
    status, body = upgrade_refused(ws_url(server))
    assert status == 401 and body["error"]["type"] == "invalid_request_error"
    assert_valid("ErrorResponse", body)

    async def served():
        client = ws_client(server, api_key="sk-local")
        async with client.responses.connect() as connection:
            await connection.response.create(model="x", input="Hi", max_output_tokens=16, temperature=0)
            events = await frames(connection)
        await client.close()
        return events

    assert asyncio.run(served())[-1]["type"] in ("response.completed", "response.incomplete")


def test_a_response_made_with_a_subprotocol_key_belongs_to_that_key(scripted_host, script, make_server, tmp_path):
    """A browser sends its key as a subprotocol (it cannot set headers): the response it makes over the socket
    belongs to that key's owner, as one made with the key in a header does; on a server with a user key and an
    admin key, the other key does not see it."""
    server = make_server(scripted_host, api_key="sk-user", admin_key="sk-admin", data_dir=str(tmp_path))

    async def made() -> str:
        async with websockets.connect(ws_url(server), subprotocols=["openai-insecure-api-key.sk-user"]) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": "x", "input": "Hi",
                                      "max_output_tokens": 16, "temperature": 0}))
            while (event := json.loads(await ws.recv()))["type"] not in ("response.completed",
                                                                          "response.incomplete"):
                assert event["type"] != "error", event
        return event["response"]["id"]

    rid = asyncio.run(made())
    mine = httpx.get(f"{server.url}/responses/{rid}", headers={"Authorization": "Bearer sk-user"})
    assert mine.status_code == 200 and mine.json()["id"] == rid
    other = httpx.get(f"{server.url}/responses/{rid}", headers={"Authorization": "Bearer sk-admin"})
    assert other.status_code == 404


def test_the_upgrade_passes_the_host_and_browser_checks(scripted_host, make_server):
    server = make_server(scripted_host, cors_origins=["http://app.example"], responses_store=False)
    status, body = upgrade_refused(ws_url(server), host="evil.example")
    assert status == 400 and "Host" in body["error"]["message"]
    status, body = upgrade_refused(ws_url(server), origin="http://evil.example")
    assert status == 403 and "cors_origins" in body["error"]["message"]

    async def from_the_allowed_page():
        async with websockets.connect(ws_url(server), origin="http://app.example") as ws:
            await ws.send(json.dumps({"type": "response.create", "model": "x", "input": "Hi",
                                      "max_output_tokens": 16, "temperature": 0}))
            while (event := json.loads(await ws.recv()))["type"] not in ("response.completed", "response.incomplete"):
                assert event["type"] != "error", event
        return event

    assert asyncio.run(from_the_allowed_page())["response"]["status"] in ("completed", "incomplete")



def test_a_client_that_leaves_stops_its_response(srserver, srclient, script):
    script.script(held())   # a long reply, still running until the request ends
    body = {"type": "response.create", "model": "x", "input": "Write a very long story about a dragon.",
            "temperature": 0}

    async def leave_after_the_first_words():
        async with websockets.connect(ws_url(srserver)) as ws:
            await ws.send(json.dumps(body))
            response_id = None
            while (event := json.loads(await ws.recv()))["type"] != "response.output_text.delta":
                response_id = event.get("response", {}).get("id", response_id)
        return response_id

    response_id = asyncio.run(leave_after_the_first_words())
    health = srserver.url.removesuffix("/v1") + "/health"
    wait_until(lambda: httpx.get(health).json()["running"] == 0, "the generation stopped")
    wait_until(lambda: srclient.responses.retrieve(response_id).status == "cancelled", "the response was stored")
    assert srclient.responses.create(model="x", input="Say hi.", max_output_tokens=16).status != "failed"


def test_a_failure_after_the_start_ends_the_response_and_the_connection_serves_on(scripted_host, make_server):
    server = make_server(FailingHost(scripted_host), responses_store=False)

    async def go():
        client = ws_client(server)
        async with client.responses.connect() as connection:
            await connection.response.create(model="x", input="Tell me about Paris.", max_output_tokens=40)
            failed = await frames(connection)
            await connection.response.create(model="x", input="Hi", max_output_tokens=3)
            error = await frames(connection)
        await client.close()
        return failed, error

    failed, error = asyncio.run(go())
    assert failed[-1]["type"] == "response.failed"
    response = failed[-1]["response"]
    assert response["status"] == "failed" and response["error"]["code"] == "server_error"
    assert "RuntimeError" in response["error"]["message"]
    assert error[-1]["type"] == "error" and error[-1]["error"]["param"] == "max_output_tokens"


def test_an_upgrade_the_server_cannot_take_says_to_use_http(srserver):
    """Without a WebSocket library uvicorn hands the upgrade on as a plain GET (here sent as one,
    in process, since this machine has the library): the answer says what to do."""
    from fastapi.testclient import TestClient

    app = TestClient(srserver.app, base_url="http://localhost")
    r = app.get("/v1/responses", headers={"Upgrade": "websocket", "Connection": "Upgrade"})
    assert r.status_code == 501 and "POST /v1/responses" in r.json()["error"]["message"]
    assert_valid("ErrorResponse", r.json())
    r = app.get("/v1/responses")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_hostile_frames_get_error_events_and_the_other_lanes_serve_on(srserver, script):
    """A frame nested past the limit, or holding a number JSON has not, is an ``error`` event,
    as the same body over HTTP is a 400 (core/bodies.py reads both); a response running on
    another lane meanwhile goes on, and the connection takes the next request."""
    running = Reply("The first lane's answer goes on and ends well.", gate=threading.Event(), gate_at=2)
    script.script(running, "Hello again.")

    async def go():
        client = ws_client(srserver)
        seen: list[dict] = []
        async with client.responses.connect() as connection:
            await connection.send({"type": "response.create", "stream_id": "a", "model": "x", "input": "Hi",
                                   "max_output_tokens": 40})
            await asyncio.to_thread(running.started.wait, 60)
            deep = "[" * 50_000 + "]" * 50_000
            await connection.send_raw('{"type": "response.create", "stream_id": "b", "model": "x", "input": "Hi", '
                                      f'"metadata": {deep}}}')
            seen += await frames(connection, until=("error",))
            await connection.send_raw('{"type": "response.create", "stream_id": "b", "model": "x", "input": "Hi", '
                                      '"temperature": NaN}')
            seen += await frames(connection, until=("error",))
            running.gate.set()
            seen += await frames(connection)
            await connection.send({"type": "response.create", "stream_id": "b", "model": "x", "input": "Hi",
                                   "max_output_tokens": 16})
            seen += await frames(connection)
        await client.close()
        return seen

    seen = asyncio.run(go())
    too_deep, not_finite = [e for e in seen if e["type"] == "error"]
    assert too_deep["status"] == 400 and too_deep["error"]["code"] == "invalid_json"
    assert str(MAX_DEPTH) in too_deep["error"]["message"]
    assert not_finite["status"] == 400 and not_finite["error"]["param"] == "temperature"
    assert "finite number" in not_finite["error"]["message"]
    done = {e["stream_id"]: e["response"] for e in seen if e["type"] == "response.completed"}
    assert done["a"]["output"][0]["content"][0]["text"] == running.text
    assert done["b"]["output"][0]["content"][0]["text"] == "Hello again."
