"""Compaction: POST /v1/responses/compact, context_management on /v1/responses, and compaction
items sent back as input, through the openai SDK on the scripted host. The summaries are its
default reply; what is checked is the mechanism: what the model is shown next, that long loops keep
running inside the context, usage, the events, and every body against OpenAI's spec."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.responses_api import create, parse_events
from support.scripted import forced
from support.spec import assert_valid, error_of

from openai_ext.responses.compacted import decode

FACTS = ["the cat is called Tom", "the dog is called Rex", "the fish is called Bubbles", "the bird is called Kiwi",
         "the horse is called Star", "the cow is called Daisy", "the goat is called Billy", "the pig is called Pinky",
         "the duck is called Quack", "the mouse is called Squeak"]

LOOKUP = {"type": "function", "name": "read_page", "description": "Read the next page of the report.",
          "parameters": {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"],
                         "additionalProperties": False}, "strict": True}


def ten_turns() -> list[dict]:
    """Ten turns of about 100 tokens each, most of them in the assistant's wordy replies."""
    out: list[dict] = []
    for i, fact in enumerate(FACTS):
        reply = f"Noted: {fact}. " + "I will keep that in mind for the rest of our talk about the farm. " * 6
        out.append({"role": "user", "content": f"Remember this: {fact}."})
        out.append({"type": "message", "role": "assistant", "id": f"msg_a{i}", "status": "completed",
                    "content": [{"type": "output_text", "text": reply, "annotations": []}]})
    return out


def compact(srclient, **kw):
    """responses.compact, the body validated against OpenAI's spec. The SDK is told not to check
    the body against its own type: that lists only output items, so it refuses the user messages
    that OpenAI's spec (and its API) put before the compaction item."""
    lenient = srclient.with_options()
    lenient._strict_response_validation = False
    raw = lenient.responses.with_raw_response.compact(**{"model": "gpt-4o", **kw})
    body = raw.http_response.json()
    assert_valid("CompactResource", body)
    return raw.parse(), body


def prompt_of(scripted_host, turns: list[dict]) -> int:
    return len(scripted_host.tokenize(scripted_host.chat_prompt(turns).text))


def test_compact_a_ten_turn_history_and_continue_from_it(srclient, scripted_host):
    history = ten_turns()
    compacted, body = compact(srclient, input=history, instructions="You are a farm assistant.")
    assert body["object"] == "response.compaction" and body["id"].startswith("resp_")
    # OpenAI's shape: the user messages, then one compaction item
    *users, last = compacted.output
    assert last.type == "compaction" and last.id.startswith("cmp_")
    assert users and all(u.type == "message" and u.role == "user" for u in users)
    assert [u.content[0].text for u in users] == [h["content"] for h in history if h["role"] == "user"][-len(users):]
    usage = compacted.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    summary, kept = decode(last.encrypted_content, "x")
    assert summary and [k["content"][0]["text"] for k in kept] == [u.content[0].text for u in users]

    # The compacted window goes back as input, as is, with the next user message.
    window = body["output"]
    nxt, _ = create(srclient, input=[*window, {"role": "user", "content": "What is the cat called?"}],
                    max_output_tokens=20)
    assert nxt.status in ("completed", "incomplete")
    seen = [{"role": "system", "content": f"Summary of the conversation so far:\n{summary}"},
            *[{"role": "user", "content": u.content[0].text} for u in users],
            {"role": "user", "content": "What is the cat called?"}]
    assert nxt.usage.input_tokens == prompt_of(scripted_host, seen)
    whole = [{"role": h["role"], "content": h["content"] if h["role"] == "user" else h["content"][0]["text"]}
             for h in history]
    assert nxt.usage.input_tokens < prompt_of(scripted_host, [*whole, seen[-1]])
    # Items before the compaction item are superseded by it: sending them too changes nothing.
    again, _ = create(srclient, input=[*history, *window, {"role": "user", "content": "What is the cat called?"}],
                      max_output_tokens=20)
    assert again.usage.input_tokens == nxt.usage.input_tokens


def test_compact_from_a_previous_response(srclient):
    first, _ = create(srclient, input=ten_turns()[:6], max_output_tokens=16)
    compacted, _ = compact(srclient, previous_response_id=first.id)
    assert compacted.output[-1].type == "compaction"
    summary, kept = decode(compacted.output[-1].encrypted_content, "x")
    assert [k["content"][0]["text"] for k in kept][-1] == ten_turns()[4]["content"]


def agent_loop(srclient, turns: int, **kw) -> list:
    """A research agent reading a long report page by page, chained by previous_response_id:
    every page read adds a long tool output to the context."""
    page = "The report continues. " + "Sales rose in the north and fell in the south. " * 28
    responses, previous = [], None
    for i in range(turns):
        if previous is None:
            new = "Read the whole report, page by page, with read_page."
        else:
            call = next(o for o in previous.output if o.type == "function_call")
            new = [{"type": "function_call_output", "call_id": call.call_id, "output": f"Page {i}: {page}"}]
        previous, _ = create(srclient, input=new, tools=[LOOKUP], tool_choice="required", parallel_tool_calls=False,
                             max_output_tokens=40,
                             previous_response_id=previous.id if previous else None, **kw)
        responses.append(previous)
    return responses


def test_an_agent_loop_with_context_management_keeps_running_past_the_context(srclient, srserver, script):
    # The agent's turns are forced calls (their prompt ends inside the call's prefill); a summary
    # is asked for in a prompt of its own.
    script.default = lambda prompt: forced({"page": 1}) if prompt.text.endswith('"arguments": ') else \
        "Summary: the report was read page by page; sales rose in the north and fell in the south."
    # Without it, the same loop fails once the pages outgrow the context (2,048 tokens here).
    with pytest.raises(openai.BadRequestError) as e:
        agent_loop(srclient, 9)
    assert e.value.body["code"] == "context_length_exceeded"

    done = agent_loop(srclient, 9, context_management=[{"type": "compaction", "compact_threshold": 1000}])
    assert all(r.status == "completed" for r in done), [(r.status, r.usage.input_tokens, [(o.type, getattr(o, "arguments", None)) for o in r.output]) for r in done]
    compacted = [i for i, r in enumerate(done) if r.output[0].type == "compaction"]
    assert compacted, [r.usage.input_tokens for r in done]
    for i in compacted:
        # the compaction comes first, then the answer from the compacted context (a call, as required)
        assert [o.type for o in done[i].output][1:] == ["function_call"]
    # a response is compacted exactly when its prompt would pass the threshold
    assert all(r.usage.input_tokens <= 1000 for i, r in enumerate(done) if i not in compacted)
    stored = httpx.get(f"{srserver.url}/responses/{done[-1].id}").json()
    assert_valid("Response", stored)


def test_compaction_streams_as_an_output_item(srserver, srclient):
    r = httpx.post(f"{srserver.url}/responses", timeout=300, json={
        "model": "x", "temperature": 0, "stream": True, "max_output_tokens": 16,
        "context_management": [{"type": "compaction", "compact_threshold": 1000}],
        "input": [*ten_turns(), {"role": "user", "content": "Which animals are there?"}]})
    assert r.status_code == 200, r.text
    events = parse_events(r.text)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.output_item.done"]
    assert events[2]["item"]["type"] == "compaction" and events[2]["output_index"] == 0
    assert events[2]["item"] == events[3]["item"]
    final = events[-1]["response"]
    assert final["output"][0] == events[3]["item"] and final["output"][1]["type"] == "message"
    # usage counts the summarising passes as well as the answer
    _, kept = decode(events[3]["item"]["encrypted_content"], "x")
    assert kept[-1]["content"][0]["text"] == "Which animals are there?"
    assert final["usage"]["input_tokens"] > 1000


def test_stateless_chaining_with_context_management(srclient):
    """store false, the output appended to the input each turn (the compaction item included)."""
    cm = [{"type": "compaction", "compact_threshold": 1000}]
    context = [*ten_turns(), {"role": "user", "content": "List the animals."}]
    first, _ = create(srclient, input=context, max_output_tokens=16, store=False, context_management=cm)
    assert first.output[0].type == "compaction"
    context += [o.model_dump(exclude_none=True) for o in first.output]
    context.append({"role": "user", "content": "And the cat?"})
    second, _ = create(srclient, input=context, max_output_tokens=16, store=False, context_management=cm)
    # the compacted context is small now: no second compaction is needed
    assert [o.type for o in second.output] == ["message"]
    assert second.usage.input_tokens < 1000


def test_a_compaction_trigger_compacts_now(srclient):
    resp, body = create(srclient, input=[*ten_turns(), {"type": "compaction_trigger"}])
    assert [o.type for o in resp.output] == ["compaction"] and resp.status == "completed"
    assert resp.usage.output_tokens > 0


def test_compaction_errors(srserver, srclient):
    url = srserver.url
    err = error_of(httpx.post(f"{url}/responses", json={"input": [
        {"type": "compaction", "encrypted_content": "made-up"}, {"role": "user", "content": "Hi"}]}), 400)
    assert err["param"] == "input[0].encrypted_content" and "compaction" in err["message"]
    err = error_of(httpx.post(f"{url}/responses", json={"input": [
        {"type": "compaction_trigger"}, {"role": "user", "content": "Hi"}]}), 400)
    assert err["param"] == "input[0].type" and "last" in err["message"]
    err = error_of(httpx.post(f"{url}/responses/compact", json={"model": "x", "input": []}), 400)
    assert err["param"] == "input"
    err = error_of(httpx.post(f"{url}/responses/compact", json={"model": "x", "input": "Hi", "stream": True}), 400)
    assert err["param"] == "stream"
    err = error_of(httpx.post(f"{url}/responses/compact", json={"model": "x", "previous_response_id": "resp_no"}),
                   404)
    assert err["param"] == "previous_response_id"
    for cm, param in [([], "context_management"), ([{"type": "trim"}], "context_management[0].type"),
                      ([{"type": "compaction", "compact_threshold": 10}], "context_management[0].compact_threshold"),
                      ([{"type": "compaction", "when": 1}], "context_management[0].when")]:
        err = error_of(httpx.post(f"{url}/responses", json={"input": "Hi", "context_management": cm}), 400)
        assert err["param"] == param, err
    # the server is still serving
    assert create(srclient, input="Hi", max_output_tokens=16)[0].status in ("completed", "incomplete")
