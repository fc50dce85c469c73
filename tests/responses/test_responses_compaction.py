"""Compaction: POST /v1/responses/compact, context_management on /v1/responses, and compaction
items sent back as input, through the openai SDK on the scripted host. The summaries are its
default reply; what is checked is the mechanism: what the model is shown next, that long loops keep
running inside the context, usage, the events, and every body against OpenAI's spec."""

from __future__ import annotations

import asyncio
import base64
import json
import zlib

import httpx
import openai
import pytest
from support.responses_api import create, parse_events
from support.scripted import forced
from support.spec import assert_valid, error_of

from openai_ext.responses import answers, compacted, compaction, convert
from openai_ext.responses import items as items_
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


# --- forged compaction items ------------------------------------------------------------------
# encrypted_content is not signed: a client may send any. Reading one costs at most what the
# largest one this server makes costs, and what it keeps is checked as input items are.
def forged(kept: list, summary: str = "S") -> str:
    return compacted.PREFIX + base64.urlsafe_b64encode(zlib.compress(json.dumps(
        {"summary": summary, "kept": kept}).encode(), 9)).decode()


def with_compaction(content: str, *after: dict) -> dict:
    return {"model": "x", "max_output_tokens": 16, "input": [
        {"role": "user", "content": "Earlier."}, {"type": "compaction", "encrypted_content": content}, *after,
        {"role": "user", "content": "Go on."}]}


class Spies:
    """What reading compaction items cost: the bytes the decompressor produced, the items
    validated, and whether any of it ran on a thread with a running event loop."""

    def __init__(self, monkeypatch):
        self.produced = 0
        self.validated = 0
        self.on_loop = 0
        spies = self
        real_zlib, real_validate = zlib, items_._validate

        class Unpacker:
            def __init__(self):
                self.real = real_zlib.decompressobj()

            def decompress(self, data, max_length=0):
                try:
                    asyncio.get_running_loop()
                    spies.on_loop += 1
                except RuntimeError:
                    pass
                out = self.real.decompress(data, max_length)
                spies.produced += len(out)
                return out

            def __getattr__(self, name):
                return getattr(self.real, name)

        class Zlib:
            error = real_zlib.error
            compress = staticmethod(real_zlib.compress)
            decompressobj = Unpacker

        def validate(model, raw, loc):
            spies.validated += "encrypted_content" in loc
            return real_validate(model, raw, loc)

        monkeypatch.setattr(compacted, "zlib", Zlib)
        monkeypatch.setattr(items_, "_validate", validate)


MESSAGE = {"type": "message", "role": "user", "id": "msg_1", "status": "completed",
           "content": [{"type": "input_text", "text": "Hi"}]}


def test_a_forged_compaction_that_unpacks_past_the_bound_is_refused_as_it_unpacks(srserver, monkeypatch):
    # the operator's fuzzing case: a few hundred KB that unpack to tens of MB of kept items
    content = forged([MESSAGE] * 500_000)
    assert len(content) < 400_000
    spies = Spies(monkeypatch)
    err = error_of(httpx.post(f"{srserver.url}/responses", json=with_compaction(content), timeout=60), 400)
    assert err["param"] == "input[1].encrypted_content" and err["code"] == "invalid_encrypted_content"
    assert "8 MiB" in err["message"]
    # the decompressor stopped one byte past the bound; nothing kept was validated
    assert spies.produced <= compacted.MAX_DECODED + 1 and spies.validated == 0 and spies.on_loop == 0


def test_a_forged_compaction_that_keeps_too_many_items_is_refused_before_any_is_validated(srserver, monkeypatch):
    content = forged([{"role": "user", "content": "x"}] * (compacted.MAX_KEPT + 1))
    spies = Spies(monkeypatch)
    err = error_of(httpx.post(f"{srserver.url}/responses", json=with_compaction(content), timeout=60), 400)
    assert err["param"] == "input[1].encrypted_content" and str(compacted.MAX_KEPT) in err["message"]
    assert spies.validated == 0 and spies.on_loop == 0
    # a long content is refused before it is even unpacked
    spies.produced = 0
    err = error_of(httpx.post(f"{srserver.url}/responses", json=with_compaction(
        compacted.PREFIX + "A" * compacted.MAX_CONTENT), timeout=60), 400)
    assert err["param"] == "input[1].encrypted_content" and spies.produced == 0


def test_the_compaction_items_of_one_request_share_one_bound(srserver, monkeypatch):
    """Each within its own bound, but together past the request's: everything before the latest
    one is replaced by it, so the client is told to send that one alone."""
    big = forged([{"role": "user", "content": "y" * (compacted.MAX_DECODED // 2)}])
    spies = Spies(monkeypatch)
    body = with_compaction(big, *[{"type": "compaction", "encrypted_content": big}] * 4)
    err = error_of(httpx.post(f"{srserver.url}/responses", json=body, timeout=60), 400)
    # four of them unpack to more than twice the bound of one: the fourth is refused
    assert err["param"] == "input[4].encrypted_content" and "only the latest one" in err["message"]
    assert spies.produced <= compacted.MAX_DECODED_TOTAL + 1


SAME_CHECKS = [
    {"type": "message", "content": "no role"},
    {"type": "message", "role": "user", "content": "x", "colour": "red"},
    {"type": "message", "role": "user", "content": [{"type": "input_audio"}]},
    {"type": "message", "role": "user", "content": [{"type": "output_text", "text": "x"}]},
    {"type": "function_call", "call_id": "c1", "name": "f"},
    {"type": "function_call_output", "call_id": "nobody", "output": "orphan"},
    {"type": "web_search_call"},
]


@pytest.mark.parametrize("bad", SAME_CHECKS, ids=[str(b)[:40] for b in SAME_CHECKS])
def test_kept_items_get_the_checks_input_items_get(srserver, bad):
    """The same 400 as for an input item, its param and message naming the kept item inside
    the compaction item's content."""
    url = f"{srserver.url}/responses"
    as_input = error_of(httpx.post(url, json={"model": "x", "input": [MESSAGE, bad]}, timeout=30), 400)
    as_kept = error_of(httpx.post(url, json=with_compaction(forged([MESSAGE, bad])), timeout=30), 400)
    assert as_input["param"].startswith("input[1]"), as_input
    inside = "input[1].encrypted_content[1]"
    assert as_kept["param"] == as_input["param"].replace("input[1]", inside, 1), (as_input, as_kept)
    assert as_kept["message"] == as_input["message"].replace("input[1]", inside), (as_input, as_kept)
    assert as_kept["code"] == as_input["code"]


def test_kept_items_a_compaction_never_holds_are_refused(srserver):
    for kind in ({"type": "item_reference", "id": "msg_1"}, {"type": "compaction", "encrypted_content": "x"},
                 {"type": "compaction_trigger"}):
        err = error_of(httpx.post(f"{srserver.url}/responses", json=with_compaction(forged([kind])), timeout=30), 400)
        assert err["param"] == "input[1].encrypted_content[0].type" and "never keeps" in err["message"], err
    err = error_of(httpx.post(f"{srserver.url}/responses", json=with_compaction(forged(["text"])), timeout=30), 400)
    assert err["param"] == "input[1].encrypted_content[0]" and "must be an object" in err["message"], err


def test_kept_items_in_any_input_shape_are_read_as_input_is(srclient, scripted_host):
    """A kept item as a client may write an input item (no type, no id, a string) is taken, in
    the shape it is stored in; the model sees it after the summary."""
    content = forged([{"role": "user", "content": "The cat is called Tom."},
                      {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "seen"}], summary="Farm talk.")
    resp, _ = create(srclient, input=[{"type": "compaction", "encrypted_content": content},
                                      {"type": "function_call_output", "call_id": "c1", "output": "again"},
                                      {"role": "user", "content": "Who is Tom?"}], max_output_tokens=16)
    assert resp.status in ("completed", "incomplete")
    prompt = scripted_host.calls[-1].prompt.text
    assert "Farm talk." in prompt and "The cat is called Tom." in prompt and "Who is Tom?" in prompt


def test_a_compaction_keeps_no_output_without_its_call(scripted_host):
    """Parallel calls and their outputs are kept together, however small the budget, and an
    output whose call is summarised is summarised with it: what is kept passes the checks a
    compaction item's kept items get when it comes back."""
    def fc(c):
        return {"type": "function_call", "call_id": c, "name": "f", "arguments": "{}", "id": f"fc_{c}"}

    def out(c):
        return {"type": "function_call_output", "call_id": c, "output": "r " * 50, "id": f"fco_{c}"}

    user = {**MESSAGE, "content": [{"type": "input_text", "text": "Do it. " * 40}]}
    for context in ([user, fc("a"), fc("b"), out("a"), out("b")],
                    [{"type": compaction.SUMMARY_ITEM, "text": "Before."}, out("z"), user, fc("a"), out("a")],
                    [{"type": compaction.SUMMARY_ITEM, "text": "Before."}, out("z")]):
        older, kept = compaction.split(scripted_host, context, 8, users_only=False, starts=convert.starts(context))
        assert [it["type"] for it in [*older, *kept]].count("function_call_output") == \
            [it["type"] for it in context].count("function_call_output")
        assert all(it["type"] != compaction.SUMMARY_ITEM for it in kept)
        answers.check_call_outputs([], kept)
        items_.parse([{"type": "compaction", "encrypted_content": compaction.item("S", kept)["encrypted_content"]}])


def test_a_compaction_keeps_what_its_item_can_hold(scripted_host):
    many = [{**MESSAGE, "id": f"msg_{i}"} for i in range(compacted.MAX_KEPT + 10)]
    _, kept = compaction.split(scripted_host, many, 10**9, users_only=True, starts=[])
    assert len(kept) == compacted.MAX_KEPT and kept[-1] is many[-1]
    large = [{**MESSAGE, "id": f"msg_{i}", "content": [{"type": "input_text", "text": "z " * 2**20}]}
             for i in range(6)]
    _, kept = compaction.split(scripted_host, large, 10**9, users_only=True, starts=[])
    assert sum(compacted.size(it) for it in kept) <= compacted.KEPT_BYTES and 0 < len(kept) < 6


def test_kept_items_packed_ahead_make_the_same_content():
    """The kept items are packed where the compaction is planned; the item made from them once
    the summary is written reads back as one packed whole."""
    kept = [{**MESSAGE, "id": f"msg_{i}", "content": [{"type": "input_text", "text": f"Fact {i}. " * i}]}
            for i in range(200)]
    for summary in ("", "A summary.", "é" * compacted.SUMMARY_CHARS * 2):
        content = compacted.encode(summary, compacted.Kept(kept))
        assert decode(content, "x") == decode(compacted.encode(summary, kept), "x") == \
            (summary[:compacted.SUMMARY_CHARS], kept)
