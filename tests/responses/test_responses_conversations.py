"""The Conversations API, and responses that continue a conversation and append their turns to it."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.responses_api import create
from support.spec import assert_valid, error_of


def raw(sclient, call, *args, **kw):
    body = call(*args, **kw).http_response.json()
    return body


def test_create_retrieve_update_delete(srclient, srserver):
    conv = raw(srclient, srclient.conversations.with_raw_response.create, metadata={"project": "demo"},
               items=[{"type": "message", "role": "user", "content": "Hello!"}])
    assert_valid("ConversationResource", conv)
    assert conv["id"].startswith("conv_") and conv["metadata"] == {"project": "demo"}
    got = raw(srclient, srclient.conversations.with_raw_response.retrieve, conv["id"])
    assert got == conv
    updated = raw(srclient, srclient.conversations.with_raw_response.update, conv["id"], metadata={"project": "x"})
    assert_valid("ConversationResource", updated)
    assert updated["metadata"] == {"project": "x"} and updated["created_at"] == conv["created_at"]
    deleted = raw(srclient, srclient.conversations.with_raw_response.delete, conv["id"])
    assert_valid("DeletedConversationResource", deleted)
    assert deleted == {"id": conv["id"], "object": "conversation.deleted", "deleted": True}
    error_of(httpx.get(f"{srserver.url}/conversations/{conv['id']}"), 404)


def test_items_add_list_retrieve_delete(srclient, srserver):
    conv = srclient.conversations.create()
    added = raw(srclient, srclient.conversations.items.with_raw_response.create, conv.id, items=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"}])
    assert_valid("ConversationItemList", added)
    ids = [i["id"] for i in added["data"]]
    listed = httpx.get(f"{srserver.url}/conversations/{conv.id}/items", params={"order": "asc"}).json()
    assert_valid("ConversationItemList", listed)
    assert [i["id"] for i in listed["data"]] == ids
    assert listed["data"][1]["content"] == [{"type": "output_text", "text": "two", "annotations": [], "logprobs": []}]
    page = srclient.conversations.items.list(conv.id, limit=1)
    assert [i.id for i in page.data] == [ids[2]] and page.has_more
    item = raw(srclient, srclient.conversations.items.with_raw_response.retrieve, ids[0], conversation_id=conv.id)
    assert_valid("ConversationItem", item)
    assert item["content"][0]["text"] == "one"
    after = raw(srclient, srclient.conversations.items.with_raw_response.delete, ids[0], conversation_id=conv.id)
    assert_valid("ConversationResource", after)
    assert [i.id for i in srclient.conversations.items.list(conv.id, order="asc")] == ids[1:]
    error_of(httpx.get(f"{srserver.url}/conversations/{conv.id}/items/{ids[0]}"), 404)


def test_responses_continue_and_extend_a_conversation(srclient, scripted_host):
    conv = srclient.conversations.create(items=[{"role": "user", "content": "My name is Ada."},
                                               {"role": "assistant", "content": "Hello Ada!"}])
    resp, body = create(srclient, conversation=conv.id, input="What is my name?", max_output_tokens=20)
    assert body["conversation"] == {"id": conv.id}
    turns = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada!"},
             {"role": "user", "content": "What is my name?"}]
    assert resp.usage.input_tokens == len(scripted_host.tokenize(scripted_host.chat_prompt(turns).text))
    items = list(srclient.conversations.items.list(conv.id, order="asc"))
    assert [i.role for i in items] == ["user", "assistant", "user", "assistant"]
    assert items[-1].id == resp.output[0].id and items[-1].content[0].text == resp.output_text
    # the next turn sees the one before, given as {"id": ...}
    nxt, _ = create(srclient, conversation={"id": conv.id}, input="Thanks.", max_output_tokens=16)
    assert nxt.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens
    assert len(list(srclient.conversations.items.list(conv.id))) == 6


def test_conversation_errors(srclient, srserver):
    with pytest.raises(openai.NotFoundError) as e:
        create(srclient, conversation="conv_missing", input="Hi", max_output_tokens=16)
    assert e.value.body["param"] == "conversation"
    first, _ = create(srclient, input="Hi", max_output_tokens=16)
    conv = srclient.conversations.create()
    with pytest.raises(openai.BadRequestError) as e:
        create(srclient, conversation=conv.id, previous_response_id=first.id, input="Hi", max_output_tokens=16)
    assert e.value.body["param"] == "conversation"
    err = error_of(httpx.post(f"{srserver.url}/conversations", json={"metadata": {"k": "v" * 600}}), 400)
    assert err["param"] == "metadata"
    err = error_of(httpx.post(f"{srserver.url}/conversations/{conv.id}/items",
                              json={"items": [{"type": "web_search_call", "id": "ws_1"}]}), 400)
    assert err["param"] == "items[0].type"
    error_of(httpx.post(f"{srserver.url}/conversations/conv_missing/items",
                        json={"items": [{"role": "user", "content": "x"}]}), 404)
    # an id that could never be a conversation's is a 400, as at OpenAI
    with pytest.raises(openai.BadRequestError) as e:
        srclient.conversations.retrieve("not-a-conversation")
    assert e.value.body["param"] == "conversation_id" and "conv" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        create(srclient, conversation="abc", input="Hi", max_output_tokens=16)
    assert e.value.body["param"] == "conversation"
