"""Anthropic's MCP connector (``mcp_servers`` on /v1/messages), through the official anthropic SDK's
beta client, against a real MCP server (support/mcp_servers.py) over Streamable HTTP and SSE. The
scripted host plays the model, so every pass is known: a forced call and the answer after it, a
chain of calls in one response, the tools a configuration hides, a tool that fails, a server that
hangs, mixed client and MCP calls, the call limit, multi-turn history with the MCP blocks sent
back, and the refusals (no beta header, a host mcp_allow does not allow, clashing names). Bodies
and events are validated strictly against the SDK's beta types. One test runs the real model."""

from __future__ import annotations

import json
import logging
import socket
import threading

import anthropic
import httpx
import pytest
from support.anthropic_types import anthropic_client, assert_error, assert_events, assert_message
from support.mcp_servers import start_demo_server
from support.scripted import call, forced
from support.servers import free_port, idle, wait_until

OLD = "mcp-client-2025-04-04"
NEW = "mcp-client-2025-11-20"
TOKEN = "tok-3b8e1f-never-shown"
ASK = [{"role": "user", "content": "What is 2 plus 3?"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def demo():
    server = start_demo_server()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh(demo):
    demo.reset()
    yield
    demo.release.set()     # a held 'wait' call ends


@pytest.fixture(scope="module")
def mcp_api(scripted_host, make_server):
    """The API on the scripted host, allowed to reach the MCP servers of this machine."""
    return make_server(scripted_host, mcp_allow=["127.0.0.1"], mcp_timeout=20)


@pytest.fixture(scope="module")
def impatient_api(scripted_host, make_server):
    """The same, giving an MCP call 1.5 s."""
    return make_server(scripted_host, mcp_allow=["127.0.0.1"], mcp_timeout=1.5)


@pytest.fixture
def api(mcp_api, script):
    return mcp_api


@pytest.fixture(scope="module")
def claude(mcp_api):
    return anthropic_client(mcp_api)


def server(demo, **extra):
    return {"type": "url", "url": demo.url, "name": "demo", "authorization_token": TOKEN, **extra}


def create(client, *, betas=(NEW,), **body):
    """A beta request's raw Message, validated strictly as the SDK's BetaMessage."""
    body.setdefault("messages", ASK)
    if NEW in betas and "mcp_servers" in body and not any(t.get("type") == "mcp_toolset" for t in body.get("tools", [])):
        body["tools"] = [*body.get("tools", []), *({"type": "mcp_toolset", "mcp_server_name": s["name"]}
                                                   for s in body["mcp_servers"])]
    body.setdefault("max_tokens", 200)
    raw = client.beta.messages.with_raw_response.create(model="x", betas=list(betas), **body)
    message = raw.http_response.json()
    assert_message(message, beta=True)
    assert TOKEN not in raw.http_response.text
    return message


def types(message):
    return [b["type"] for b in message["content"]]


def prompts(script):
    return [c.prompt.text for c in script.calls]


def offered(prompt: str) -> set[str]:
    """The tools the prompt lists (the fallback instructions write one JSON object a line)."""
    names = set()
    for line in prompt.splitlines():
        try:
            tool = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(tool, dict) and "parameters" in tool:
            names.add(tool["name"])
    return names


def test_a_forced_call_then_the_answer(api, claude, script, demo):
    script.script(forced({"a": 2, "b": 3}), "The sum is 5.")
    message = create(claude, betas=[OLD], mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"})
    assert types(message) == ["mcp_tool_use", "mcp_tool_result", "text"]
    use, result, text = message["content"]
    assert use["id"].startswith("mcptoolu_") and use["name"] == "add" and use["server_name"] == "demo"
    assert use["input"] == {"a": 2, "b": 3}
    assert result == {"type": "mcp_tool_result", "tool_use_id": use["id"], "is_error": False,
                      "content": [{"type": "text", "text": "5"}]}
    assert text["text"] == "The sum is 5." and message["stop_reason"] == "end_turn"
    # the MCP server was called, with the token as a bearer credential on every request
    assert demo.calls == [("add", {"a": 2, "b": 3})]
    assert demo.headers and all(h.get("authorization") == f"Bearer {TOKEN}" for h in demo.headers)
    # the second pass saw the call and its result, and was not forced again
    first, second = prompts(script)
    assert first.endswith('"arguments": ') and not second.endswith('"arguments": ')
    assert offered(first) == {"add"} and offered(second) == {"add", "echo", "fail", "wait"}
    assert '"name": "add", "arguments": {"a": 2, "b": 3}' in second and "<tool_response>\n5\n</tool_response>" in second
    # usage counts both passes
    assert message["usage"]["input_tokens"] == sum(len(c.prompt.tokens) for c in script.calls)
    assert message["usage"]["output_tokens"] == sum(len(script.split(c.reply.text)) for c in script.calls)


def test_a_chain_of_two_calls_in_one_response(api, claude, script, demo):
    script.script(forced({"a": 2, "b": 3}), "Now I repeat it. " + call("echo", {"text": "five"}), "Done: five.")
    message = create(claude, mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"})
    assert types(message) == ["mcp_tool_use", "mcp_tool_result", "text", "mcp_tool_use", "mcp_tool_result", "text"]
    c = message["content"]
    assert c[3]["name"] == "echo" and c[3]["input"] == {"text": "five"} and c[4]["tool_use_id"] == c[3]["id"]
    assert c[4]["content"] == [{"type": "text", "text": "echo: five"}] and c[2]["text"] == "Now I repeat it."
    assert c[5]["text"] == "Done: five." and message["stop_reason"] == "end_turn"
    assert demo.calls == [("add", {"a": 2, "b": 3}), ("echo", {"text": "five"})]
    assert len({c[0]["id"], c[3]["id"]}) == 2
    assert "<tool_response>\necho: five\n</tool_response>" in prompts(script)[2]


def test_max_tokens_bounds_every_pass_together(api, claude, script, demo):
    """The passes share max_tokens: the second may write what the first left (and a thinking
    budget checked against max_tokens still holds); when nothing is left, the answer ends there."""
    script.script(forced({"a": 2, "b": 3}), "The sum is five, as the tool says. " * 200)
    message = create(claude, mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"},
                     max_tokens=1100, thinking={"type": "enabled", "budget_tokens": 1024})
    first = script.calls[0]
    assert script.calls[1].settings.max_new_tokens == 1100 - len(script.split(first.reply.text))
    assert message["usage"]["output_tokens"] == 1100 and message["stop_reason"] == "max_tokens"
    script.script(forced({"a": 2, "b": 3}))
    message = create(claude, mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"},
                     max_tokens=len(script.split(forced({"a": 2, "b": 3}))))
    assert types(message) == ["mcp_tool_use", "mcp_tool_result"] and message["stop_reason"] == "max_tokens"
    assert len(script.calls) == 3


@pytest.mark.parametrize("betas, config, tools, shown", [
    ([OLD], {"tool_configuration": {"allowed_tools": ["add", "echo"]}}, [], {"add", "echo"}),
    ([OLD], {"tool_configuration": {"enabled": False}}, [], set()),
    ([OLD], {"tool_configuration": {"enabled": True}}, [], {"add", "echo", "fail", "wait"}),
    ([NEW], {}, [{"type": "mcp_toolset", "mcp_server_name": "demo", "default_config": {"enabled": False},
                  "configs": {"echo": {"enabled": True}}}], {"echo"}),
    ([NEW], {}, [{"type": "mcp_toolset", "mcp_server_name": "demo", "configs": {"fail": {"enabled": False},
                                                                                  "wait": {"enabled": False}}}],
     {"add", "echo"}),
    ([NEW], {}, [WEATHER, {"type": "mcp_toolset", "mcp_server_name": "demo",
                           "configs": {"wait": {"enabled": False, "defer_loading": False}},
                           "cache_control": {"type": "ephemeral"}}], {"get_weather", "add", "echo", "fail"}),
])
def test_the_configuration_chooses_the_tools_offered(api, claude, script, demo, betas, config, tools, shown):
    script.script("Plain answer.")
    message = create(claude, betas=betas, mcp_servers=[server(demo, **config)], tools=tools)
    assert types(message) == ["text"] and demo.calls == []
    assert offered(prompts(script)[0]) == shown


def test_a_failing_tool_is_an_error_result_and_the_answer_goes_on(api, claude, script, demo):
    script.script(forced({"reason": "testing"}), "The tool failed, sorry.")
    message = create(claude, mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "fail"})
    assert types(message) == ["mcp_tool_use", "mcp_tool_result", "text"]
    result = message["content"][1]
    assert result["is_error"] is True and "failed" in result["content"][0]["text"]
    assert message["content"][2]["text"] == "The tool failed, sorry." and message["stop_reason"] == "end_turn"
    assert "<tool_response>\nError: the tool failed" in prompts(script)[1]


def test_a_server_that_hangs_is_a_timeout_result(impatient_api, script, demo):
    script.script(forced({"seconds": 60}), "It took too long.")
    message = create(anthropic_client(impatient_api), mcp_servers=[server(demo)],
                     tool_choice={"type": "tool", "name": "wait"})
    assert types(message) == ["mcp_tool_use", "mcp_tool_result", "text"]
    result = message["content"][1]
    assert result["is_error"] is True
    assert result["content"][0]["text"] == ("The MCP server 'demo' did not answer within 1.5 s (the mcp_timeout "
                                            "setting).")
    assert message["content"][2]["text"] == "It took too long." and demo.calls == [("wait", {"seconds": 60})]


def test_mixed_client_and_mcp_calls_end_with_tool_use_and_go_back(api, claude, script, demo):
    """A pass that calls a client tool and an MCP tool: the MCP call is run, the response ends for
    the client's; sent back with its tool_result, both calls are shown to the model in order."""
    script.script(call("get_weather", {"city": "Rome"}) + "\n" + call("add", {"a": 1, "b": 1}))
    message = create(claude, mcp_servers=[server(demo)], tools=[WEATHER])
    assert types(message) == ["tool_use", "mcp_tool_use", "mcp_tool_result"]
    assert message["stop_reason"] == "tool_use" and demo.calls == [("add", {"a": 1, "b": 1})]
    use = message["content"][0]
    script.script("Sunny in Rome, and 1 plus 1 is 2.")
    turns = [*ASK, {"role": "assistant", "content": message["content"]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sunny"}]}]
    again = create(claude, mcp_servers=[server(demo)], tools=[WEATHER], messages=turns)
    assert types(again) == ["text"] and demo.calls == [("add", {"a": 1, "b": 1})]
    shown = prompts(script)[1]
    assert shown.index('"name": "get_weather"') < shown.index('"name": "add", "arguments"') < \
        shown.index("<tool_response>\n2\n</tool_response>") < shown.index("<tool_response>\nsunny\n</tool_response>")


def test_after_the_last_call_allowed_no_mcp_tool_is_offered(api, claude, script, demo, monkeypatch):
    monkeypatch.setattr(api.app.state.api.text.settings, "mcp_max_calls", 1)
    script.script(forced({"a": 2, "b": 3}), "Five.")
    message = create(claude, mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"})
    assert types(message) == ["mcp_tool_use", "mcp_tool_result", "text"]
    first, second = prompts(script)
    assert offered(first) == {"add"} and offered(second) == set()     # (without the limit: all four, as above)


def test_mcp_blocks_sent_back_are_shown_as_calls_and_results(api, claude, script, demo):
    script.script(forced({"a": 2, "b": 3}), "The sum is 5.")
    first = create(claude, mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"})
    script.script("Yes: 5.")
    turns = [*ASK, {"role": "assistant", "content": first["content"]},
             {"role": "user", "content": "Are you sure?"}]
    again = create(claude, mcp_servers=[server(demo)], messages=turns)
    assert types(again) == ["text"] and len(demo.calls) == 1
    shown = prompts(script)[2]
    assert shown.index('"name": "add", "arguments": {"a": 2, "b": 3}') < shown.index("<tool_response>\n5\n") < \
        shown.index("The sum is 5.") < shown.index("Are you sure?")
    # without mcp_servers the history is read the same way (the blocks are the conversation's)
    script.script("Yes.")
    plain = anthropic_client(api).beta.messages.create(model="x", max_tokens=20, messages=turns, betas=[NEW])
    assert plain.content[0].text == "Yes."
    # a result whose call is not in the turn, and a call without its result, are refused
    for content, says in ((first["content"][1:], "mcp_tool_result for"), (first["content"][:1], "without its")):
        with pytest.raises(anthropic.BadRequestError) as e:
            claude.beta.messages.create(model="x", max_tokens=20, betas=[NEW], messages=[
                *ASK, {"role": "assistant", "content": content}, {"role": "user", "content": "And?"}])
        assert says in e.value.body["error"]["message"]


def test_the_stream_sends_each_block_in_order(api, claude, script, demo):
    script.script(forced({"a": 2, "b": 3}), "The sum is 5.")
    body = dict(model="x", max_tokens=200, messages=ASK, betas=[NEW], mcp_servers=[server(demo)],
                tools=[{"type": "mcp_toolset", "mcp_server_name": "demo"}], tool_choice={"type": "tool", "name": "add"})
    with claude.beta.messages.with_streaming_response.create(stream=True, **body) as r:
        text = r.read().decode()
    assert TOKEN not in text
    events = assert_events(text, beta=True)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [b["type"] for b in starts] == ["mcp_tool_use", "mcp_tool_result", "text"]
    assert starts[0]["input"] == {} and starts[0]["server_name"] == "demo"
    assert starts[1] == {"type": "mcp_tool_result", "tool_use_id": starts[0]["id"], "is_error": False,
                         "content": [{"type": "text", "text": "5"}]}      # whole in its start
    kinds = [(e["type"], e.get("index"), e.get("delta", {}).get("type")) for e in events]
    use_deltas = [k for k in kinds if k[0] == "content_block_delta" and k[1] == 0]
    assert use_deltas and all(k[2] == "input_json_delta" for k in use_deltas)
    assert json.loads("".join(e["delta"]["partial_json"] for e in events
                              if e["type"] == "content_block_delta" and e["index"] == 0)) == {"a": 2, "b": 3}
    assert not [k for k in kinds if k[0] == "content_block_delta" and k[1] == 1]   # the result has no deltas
    delta = events[-2]
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"]["input_tokens"] == sum(len(c.prompt.tokens) for c in script.calls)
    assert events[0]["message"]["usage"]["input_tokens"] == len(script.calls[0].prompt.tokens)
    # the SDK's own accumulation of the stream gives the blocks a whole response has
    script.script(forced({"a": 2, "b": 3}), "The sum is 5.")
    with claude.beta.messages.stream(**body) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["mcp_tool_use", "mcp_tool_result", "text"]
    assert final.content[0].input == {"a": 2, "b": 3} and final.content[1].content[0].text == "5"
    assert final.content[2].text == "The sum is 5."


def test_the_sse_transport(api, claude, script, demo):
    script.script(forced({"text": "over sse"}), "Echoed.")
    message = create(claude, mcp_servers=[{**server(demo), "url": demo.sse_url}],
                     tool_choice={"type": "tool", "name": "echo"})
    assert message["content"][1]["content"] == [{"type": "text", "text": "echo: over sse"}]
    assert demo.calls == [("echo", {"text": "over sse"})]
    assert all(h.get("authorization") == f"Bearer {TOKEN}" for h in demo.headers)


def test_the_token_is_never_logged_nor_echoed(make_server, scripted_host, script, demo, caplog):
    """On a server that logs every request body and stream chunk (debug), through a call, a
    stream, and errors of every kind."""
    caplog.set_level(logging.DEBUG)
    logged = make_server(scripted_host, mcp_allow=["127.0.0.1"], debug=True, debug_streams=True)
    claude = anthropic_client(logged)
    script.script(forced({"reason": "x"}), "Failed.")
    create(claude, mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "fail"})
    script.script(forced({"a": 1, "b": 2}), "Three.")
    with claude.beta.messages.with_streaming_response.create(
            model="x", max_tokens=50, messages=ASK, betas=[NEW], stream=True, mcp_servers=[server(demo)],
            tools=[{"type": "mcp_toolset", "mcp_server_name": "demo"}], tool_choice={"type": "tool", "name": "add"}) as r:
        assert TOKEN not in r.read().decode()
    # errors of every kind: a server down, a bad field, no beta header, a refused host
    for body, betas in (({"mcp_servers": [server(demo, url=f"http://127.0.0.1:{free_port()}/mcp")]}, [NEW]),
                        ({"mcp_servers": [server(demo, authorization_token=123)]}, [NEW]),
                        ({"mcp_servers": [server(demo, extra="y")]}, [NEW]),
                        ({"mcp_servers": [server(demo)]}, []),
                        ({"mcp_servers": [server(demo, url="http://10.0.0.1/mcp")]}, [NEW])):
        r = httpx.post(logged.url + "/messages", json={"model": "x", "max_tokens": 5, "messages": ASK, **body,
                                                       "tools": [{"type": "mcp_toolset", "mcp_server_name": "demo"}]},
                       headers={"anthropic-beta": ",".join(betas)} if betas else {}, timeout=30)
        assert r.status_code >= 400 and TOKEN not in r.text, r.text
    assert any(r.name == "openai_ext.requests" and "mcp_servers" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if TOKEN in r.getMessage() and not r.name.startswith("anthropic")]
    assert any(h.get("authorization") == f"Bearer {TOKEN}" for h in demo.headers)   # it was sent, all the same


def test_without_the_beta_header_mcp_servers_is_refused(api, claude, script, demo):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="x", max_tokens=5, messages=ASK, extra_body={"mcp_servers": [server(demo)]})
    assert_error(e.value.body, "invalid_request_error")
    assert "anthropic-beta: mcp-client-2025-11-20" in e.value.body["error"]["message"]
    assert demo.headers == [] and script.calls == []


@pytest.mark.parametrize("allow", [None, ["example.com"], ["127.0.0.1:1"], ["127.0.0.*"]])
def test_a_host_mcp_allow_does_not_allow_is_refused_before_anything_runs(make_server, scripted_host, script, demo,
                                                                        allow):
    target = make_server(scripted_host, **({"mcp_allow": allow} if allow else {}))
    with pytest.raises(anthropic.BadRequestError) as e:
        create(anthropic_client(target), mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"})
    assert_error(e.value.body, "invalid_request_error")
    assert "mcp-allow" in e.value.body["error"]["message"]
    assert demo.headers == [] and script.calls == []
    assert idle(target, script)


@pytest.mark.parametrize("betas, body, says", [
    ([NEW], {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "a", "authorisation_token": "t"}],
             "tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}]}, "mcp_servers[0].authorisation_token"),
    ([NEW], {"mcp_servers": [{"type": "stdio", "url": "x", "name": "a"}]}, "mcp_servers[0].type"),
    ([NEW], {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "a"}]}, "named by no mcp_toolset"),
    ([NEW], {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "a"}],
             "tools": [{"type": "mcp_toolset", "mcp_server_name": "b"}]}, "tools[0].mcp_server_name 'b' names no server"),
    ([NEW], {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "a"}],
             "tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}, {"type": "mcp_toolset", "mcp_server_name": "a"}]},
     "a second mcp_toolset"),
    ([NEW], {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "a",
                              "tool_configuration": {"enabled": True}}],
             "tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}]}, "tool_configuration belongs to"),
    ([OLD], {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "a"}],
             "tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}]}, "needs the header"),
    ([OLD], {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "a"},
                             {"type": "url", "url": "http://127.0.0.1:2/mcp", "name": "a"}]}, "its own name"),
    ([], {"tools": [{"type": "mcp_toolset", "mcp_server_name": "a"}]}, "send mcp_servers too"),
    ([OLD], {"mcp_servers": [{"type": "url", "url": "ftp://127.0.0.1/mcp", "name": "a"}]}, "http:// or https://"),
])
def test_bad_mcp_configurations_are_400s_that_say_why(api, script, betas, body, says):
    r = httpx.post(api.url + "/messages", json={"model": "x", "max_tokens": 5, "messages": ASK, **body},
                   headers={"anthropic-beta": ",".join(betas)} if betas else {}, timeout=30)
    assert r.status_code == 400, r.text
    assert_error(r.json(), "invalid_request_error")
    assert says in r.json()["error"]["message"], r.json()
    assert script.calls == []


def test_names_offered_twice_are_400s_naming_both(api, claude, demo, script):
    twice = [server(demo), {**server(demo), "name": "again"}]
    with pytest.raises(anthropic.BadRequestError) as e:
        create(claude, mcp_servers=twice)
    message = e.value.body["error"]["message"]
    assert "'demo' (mcp_servers[0])" in message and "'again' (mcp_servers[1])" in message and "'add'" in message
    mine = {**WEATHER, "name": "echo"}
    with pytest.raises(anthropic.BadRequestError) as e:
        create(claude, mcp_servers=[server(demo)], tools=[mine])
    message = e.value.body["error"]["message"]
    assert "tools[0] is named 'echo'" in message and "'demo' (mcp_servers[0])" in message
    # leaving the tool out of one of them is the remedy
    script.script("Fine.")
    create(claude, mcp_servers=[server(demo, tool_configuration={"allowed_tools": ["add"]})], tools=[mine],
           betas=[OLD])
    assert offered(prompts(script)[0]) == {"echo", "add"}


def test_a_server_whose_tools_cannot_be_listed_fails_the_request(api, claude, script, demo):
    down = server(demo, url=f"http://127.0.0.1:{free_port()}/mcp", name="down")
    with pytest.raises(anthropic.APIStatusError) as e:
        create(claude, mcp_servers=[down])
    assert e.value.status_code == 502
    assert_error(e.value.body, "api_error")
    assert "MCP server 'down' (mcp_servers[0]) could not be listed" in e.value.body["error"]["message"]
    # a URL the MCP server does not serve is the request's fault: 400
    with pytest.raises(anthropic.BadRequestError) as e:
        create(claude, mcp_servers=[server(demo, url=demo.url + "/nowhere")])
    assert "could not be listed: Not Found. Check its url" in e.value.body["error"]["message"]
    assert script.calls == []


def test_a_server_that_never_answers_the_listing_is_a_timeout_error(impatient_api, script):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()       # connections are taken, and never answered
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"
        with pytest.raises(anthropic.InternalServerError) as e:
            create(anthropic_client(impatient_api), mcp_servers=[{"type": "url", "url": url, "name": "silent"}])
    finally:
        silent.close()
    assert e.value.status_code == 504
    assert_error(e.value.body, "timeout_error")
    assert "'silent' did not answer within 1.5 s" in e.value.body["error"]["message"]
    assert script.calls == [] and idle(impatient_api, script)


def test_a_call_under_way_holds_no_generation_slot(api, script, demo):
    """While an MCP call runs, the request's place is set aside: another request is answered
    meanwhile; the first goes on once the call returns."""
    script.script(forced({"seconds": 1}), "Ordinary answer.", "Done waiting.")
    got = {}

    def first():
        got["message"] = create(anthropic_client(api), mcp_servers=[server(demo)],
                                tool_choice={"type": "tool", "name": "wait"})
    worker = threading.Thread(target=first)
    worker.start()
    wait_until(lambda: demo.calls, "the MCP server got the call")
    other = anthropic_client(api).messages.create(model="x", max_tokens=20, messages=ASK)
    assert other.content[0].text == "Ordinary answer." and worker.is_alive()
    demo.release.set()
    worker.join(30)
    message = got["message"]
    assert message["content"][1]["content"][0]["text"] == "done waiting"
    assert message["content"][2]["text"] == "Done waiting."
    assert idle(api, script)


def test_a_thread_keeps_the_mcp_blocks(api, claude, script, demo):
    script.script(forced({"a": 2, "b": 3}), "The sum is 5.")
    first = create(claude, mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"},
                   extra_body={"thread": {"type": "create"}})
    script.script("Still 5.")
    again = claude.beta.messages.create(
        model="x", max_tokens=20, betas=[NEW], messages=[{"role": "user", "content": "Sure?"}],
        mcp_servers=[server(demo)], extra_body={"thread": {"type": "continue", "previous_message_id": first["id"]}})
    assert again.content[0].text == "Still 5." and len(demo.calls) == 1
    shown = prompts(script)[2]
    assert shown.index("<tool_response>\n5\n</tool_response>") < shown.index("The sum is 5.") < shown.index("Sure?")


def test_mcp_rounds_become_chat_turns():
    """An assistant turn with MCP rounds: each round is an assistant message with the calls made
    together and a tool message per result; the text after them is the turn's own."""
    from openai_ext.messages import translate
    from openai_ext.messages.protocol import MessagesRequest

    def use(i, name, **args):
        return {"type": "mcp_tool_use", "id": f"mcptoolu_{i}", "name": name, "server_name": "demo", "input": args}

    def result(i, text, **kw):
        return {"type": "mcp_tool_result", "tool_use_id": f"mcptoolu_{i}", "content": text, **kw}
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 10, "messages": [
        *ASK, {"role": "assistant", "content": [
            {"type": "text", "text": "Working."}, use(1, "add", a=2, b=3), use(2, "echo", text="x"),
            result(1, [{"type": "text", "text": "5"}]), result(2, "echo: x"),
            {"type": "thinking", "thinking": "hm", "signature": ""},
            use(3, "fail", reason="r"), result(3, "broken", is_error=True), {"type": "text", "text": "So: 5."}]},
        {"role": "user", "content": "Thanks"}]})
    msgs = [m.model_dump(exclude_none=True) for m in translate.to_chat(req).chat.messages]
    assert [(m["role"], m.get("content"), [c["id"] for c in m.get("tool_calls", [])]) for m in msgs] == [
        ("user", "What is 2 plus 3?", []), ("assistant", "Working.", ["mcptoolu_1", "mcptoolu_2"]),
        ("tool", "5", []), ("tool", "echo: x", []), ("assistant", None, ["mcptoolu_3"]),
        ("tool", "Error: broken", []), ("assistant", "So: 5.", []), ("user", "Thanks", [])]
    assert json.loads(msgs[1]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    # a last assistant turn: the text after its rounds is the prefill the model continues
    req = req.model_copy(update={"messages": req.messages[:2]})
    tr = translate.to_chat(req)
    assert tr.prefill == "So: 5." and tr.chat.messages[-1].role == "tool"


def test_a_client_that_leaves_during_a_call_stops_it(api, script, demo):
    """The call is under way (the MCP server holds it, mcp_timeout is 20 s): the client leaves,
    streamed or not, and the request's place in line is given back within seconds; no pass runs
    after it."""
    body = {"model": "x", "max_tokens": 100, "messages": ASK, "mcp_servers": [server(demo)],
            "tools": [{"type": "mcp_toolset", "mcp_server_name": "demo"}],
            "tool_choice": {"type": "tool", "name": "wait"}}
    headers = {"anthropic-beta": NEW}
    script.script(forced({"seconds": 60}))
    with httpx.stream("POST", api.url + "/messages", json={**body, "stream": True}, headers=headers,
                      timeout=60) as r:
        lines = r.iter_lines()   # (leaving the iteration would close the connection)
        while '"content_block_stop"' not in next(lines):
            pass           # the mcp_tool_use block is whole: its call is made next
        wait_until(lambda: demo.calls, "the MCP server got the call")
    assert idle(api, script, timeout=8) and len(script.calls) == 1
    demo.reset()
    script.script(forced({"seconds": 60}))
    done = threading.Event()

    def post():
        try:
            httpx.post(api.url + "/messages", json=body, headers=headers, timeout=httpx.Timeout(60, read=2))
        except httpx.ReadTimeout:
            pass
        done.set()
    threading.Thread(target=post).start()
    wait_until(lambda: demo.calls, "the MCP server got the call")
    assert done.wait(10)
    assert idle(api, script, timeout=8) and len(script.calls) == 2


def test_count_tokens_reads_mcp_history(api, claude, demo):
    turns = [*ASK, {"role": "assistant", "content": [
        {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "add", "server_name": "demo", "input": {"a": 2, "b": 3}},
        {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "content": [{"type": "text", "text": "5"}]},
        {"type": "text", "text": "Five."}]}, {"role": "user", "content": "Thanks"}]
    counted = claude.beta.messages.count_tokens(model="x", messages=turns, betas=[NEW])
    plain = claude.beta.messages.count_tokens(model="x", messages=[*ASK, {"role": "user", "content": "Thanks"}])
    assert counted.input_tokens > plain.input_tokens
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.beta.messages.count_tokens(model="x", messages=ASK, betas=[NEW], mcp_servers=[server(demo)])
    assert "count_tokens does not list MCP servers' tools" in e.value.body["error"]["message"]
    assert TOKEN not in json.dumps(e.value.body)


# --- the real model -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live_mcp(llama_host, make_server):
    return make_server(llama_host, mcp_allow=["127.0.0.1"], mcp_timeout=20)


def test_the_real_model_calls_an_mcp_tool_and_answers(live_mcp, demo):
    claude = anthropic_client(live_mcp)
    raw = claude.beta.messages.with_raw_response.create(
        model="x", max_tokens=60, messages=[{"role": "user", "content": "Add 2 and 3 with the add tool."}],
        betas=[NEW], mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "add"},
        tools=[{"type": "mcp_toolset", "mcp_server_name": "demo",
                "configs": {"wait": {"enabled": False}, "fail": {"enabled": False}}}],
        extra_body={"temperature": 0})
    message = raw.http_response.json()
    assert_message(message, beta=True)
    use, result = message["content"][:2]
    assert use["type"] == "mcp_tool_use" and use["name"] == "add" and use["server_name"] == "demo"
    assert set(use["input"]) == {"a", "b"} and all(isinstance(v, int) for v in use["input"].values())
    assert result["type"] == "mcp_tool_result" and result["is_error"] is False
    assert result["content"][0]["text"] == str(use["input"]["a"] + use["input"]["b"])
    assert demo.calls == [("add", use["input"])]
    assert message["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    assert message["usage"]["output_tokens"] <= 60 and message["usage"]["input_tokens"] > 0
    with claude.beta.messages.with_streaming_response.create(
            model="x", max_tokens=40, messages=[{"role": "user", "content": "Echo the word hello."}], stream=True,
            betas=[NEW], mcp_servers=[server(demo)], tool_choice={"type": "tool", "name": "echo"},
            tools=[{"type": "mcp_toolset", "mcp_server_name": "demo"}], extra_body={"temperature": 0}) as r:
        events = assert_events(r.read().decode(), beta=True)
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"][:2] == \
        ["mcp_tool_use", "mcp_tool_result"]
    assert demo.calls[-1][0] == "echo"
