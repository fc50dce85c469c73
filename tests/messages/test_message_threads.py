"""Threads (the request's ``thread``): the errors Anthropic's SDK acts on, with their
error.details.error_code; the SDK's recovery when the server no longer holds a thread; and the
store itself (per key, the newest kept, a reply continued once, a prefill joined to its reply)."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from support.anthropic_types import anthropic_client, assert_error

from openai_ext.core.errors import NotFoundError
from openai_ext.messages import threads
from openai_ext.messages.protocol import MessagesRequest

Q = [{"role": "user", "content": "Say a word."}]
GREEDY = {"temperature": 0}


def post(server, body):
    return httpx.post(server.url + "/messages", json={"model": "x", "max_tokens": 4, "temperature": 0, **body},
                      timeout=60)


def test_a_thread_the_server_does_not_hold_is_not_found(scripted):
    r = post(scripted, {"messages": Q, "thread": {"type": "continue", "previous_message_id": "msg_unknown"}})
    assert r.status_code == 404, r.text
    assert_error(r.json(), "not_found_error", code="thread_not_found")
    with pytest.raises(anthropic.NotFoundError) as e:
        anthropic_client(scripted).beta.messages.create(
            model="x", max_tokens=4, messages=Q, thread={"type": "continue", "previous_message_id": "msg_unknown"})
    assert e.value.error_code == "thread_not_found"


def test_a_reply_is_continued_once(scripted):
    first = post(scripted, {"messages": Q, "thread": {"type": "create"}}).json()
    again = {"messages": [{"role": "user", "content": "Another."}],
             "thread": {"type": "continue", "previous_message_id": first["id"]}}
    second = post(scripted, again)
    assert second.status_code == 200, second.text
    r = post(scripted, again)
    assert r.status_code == 400, r.text
    assert_error(r.json(), "invalid_request_error", code="thread_already_continued")
    # the new reply is the thread's head now
    third = post(scripted, {**again, "thread": {"type": "continue", "previous_message_id": second.json()["id"]}})
    assert third.status_code == 200, third.text


def test_the_sdk_replays_a_thread_the_server_dropped(scripted_host, make_server, monkeypatch):
    monkeypatch.setattr(threads, "MAX_THREADS", 1)
    server = make_server(scripted_host)
    seen = []
    real = threads.Threads.resolve

    def resolve(self, req, owner):
        seen.append((req.thread or {}).get("type"))
        return real(self, req, owner)
    monkeypatch.setattr(threads.Threads, "resolve", resolve)
    claude = anthropic_client(server)
    one = claude.beta.messages.thread(model="x", max_tokens=4, extra_body=GREEDY)
    two = claude.beta.messages.thread(model="x", max_tokens=4, extra_body=GREEDY)
    one.send({"role": "user", "content": "Say a word."})
    two.send({"role": "user", "content": "Say a number."})     # the server keeps one thread: one's is dropped
    reply = one.send({"role": "user", "content": "Say another."})
    assert seen == ["create", "create", "continue", "create"]  # not found: the whole conversation again
    assert reply.content and one.previous_message_id == reply.id
    assert len(one.messages) == 4


def request(**kw) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "x", "max_tokens": 4, "messages": Q, **kw})


def answer(store: threads.Threads, req: MessagesRequest, owner: str, reply_id: str, text: str) -> MessagesRequest:
    asked = store.resolve(req, owner)
    asked.ticket.commit(reply_id, [{"type": "text", "text": text}])
    return asked.request


def cont(previous: str, text: str = "More.", **kw) -> MessagesRequest:
    return request(messages=[{"role": "user", "content": text}],
                   thread={"type": "continue", "previous_message_id": previous}, **kw)


def test_a_continue_is_answered_with_the_kept_conversation():
    store = threads.Threads()
    answer(store, request(system="S.", tools=[{"name": "f", "input_schema": {"type": "object"}}],
                          thread={"type": "create"}), "", "msg_1", "Word.")
    whole = store.resolve(cont("msg_1"), "").request
    assert whole.system == "S." and whole.tools[0]["name"] == "f"
    assert [(m.role, m.content if isinstance(m.content, str) else m.content[0].text) for m in whole.messages] == [
        ("user", "Say a word."), ("assistant", "Word."), ("user", "More.")]


def test_threads_are_kept_per_key():
    store = threads.Threads()
    answer(store, request(thread={"type": "create"}), "owner-a", "msg_1", "Hi.")
    with pytest.raises(NotFoundError) as e:
        store.resolve(cont("msg_1"), "owner-b")
    assert e.value.code == "thread_not_found"
    assert store.resolve(cont("msg_1"), "owner-a").request.messages


def test_the_oldest_threads_are_dropped_first_by_count_and_by_size():
    store = threads.Threads(max_threads=2)
    for k in range(3):
        answer(store, request(thread={"type": "create"}), "", f"msg_{k}", "Hi.")
    with pytest.raises(NotFoundError) as e:
        store.resolve(cont("msg_0"), "")
    assert e.value.code == "thread_not_found"
    assert store.resolve(cont("msg_1"), "") and store.resolve(cont("msg_2"), "")
    small = threads.Threads(max_chars=2000)
    answer(small, request(thread={"type": "create"}), "", "msg_a", "x" * 1500)
    answer(small, request(thread={"type": "create"}), "", "msg_b", "y" * 600)   # together over the size: the older goes
    with pytest.raises(NotFoundError):
        small.resolve(cont("msg_a"), "")
    assert small.resolve(cont("msg_b"), "")


def test_a_prefill_and_its_continuation_are_kept_as_one_turn():
    store = threads.Threads()
    answer(store, request(messages=[*Q, {"role": "assistant", "content": "The word is"}], thread={"type": "create"}),
           "", "msg_1", " blue.")
    kept = store.resolve(cont("msg_1"), "").request.messages
    assert [m.role for m in kept] == ["user", "assistant", "user"]
    assert [b.text for b in kept[1].content] == ["The word is blue."]
