"""Stored responses: previous_response_id chains, store false, retrieve and delete, input items
with OpenAI's cursor pagination, a restart that keeps them, and objects private to their key."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.responses_api import create
from support.servers import openai_client
from support.spec import assert_valid, error_of


def test_a_chain_of_previous_responses_carries_the_conversation(srclient, scripted_host):
    first, _ = create(srclient, instructions="FIRST-INSTRUCTIONS", input="My name is Ada.", max_output_tokens=20)
    second, body = create(srclient, previous_response_id=first.id, input="What is my name?", max_output_tokens=20)
    third, _ = create(srclient, previous_response_id=second.id, instructions="THIRD-INSTRUCTIONS",
                      input="And again?", max_output_tokens=20)
    assert body["previous_response_id"] == first.id
    # The prompt holds every earlier turn, and only the latest instructions (OpenAI's rule).
    turns = [{"role": "system", "content": "THIRD-INSTRUCTIONS"},
             {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "What is my name?"}, {"role": "assistant", "content": second.output_text},
             {"role": "user", "content": "And again?"}]
    assert third.usage.input_tokens == len(scripted_host.tokenize(scripted_host.chat_prompt(turns).text))
    second_turns = [t for t in turns[1:4]]
    assert second.usage.input_tokens == len(scripted_host.tokenize(scripted_host.chat_prompt(second_turns).text))
    # input_items lists a response's own input, newest first by default
    items = srclient.responses.input_items.list(third.id)
    assert [i.content[0].text for i in items.data] == ["And again?"]


def test_retrieve_and_delete(srclient, srserver):
    resp, body = create(srclient, input="Say hi.", max_output_tokens=16)
    got = httpx.get(f"{srserver.url}/responses/{resp.id}").json()
    assert_valid("Response", got)
    assert got == body
    deleted = httpx.delete(f"{srserver.url}/responses/{resp.id}").json()
    assert deleted == {"id": resp.id, "object": "response", "deleted": True}
    err = error_of(httpx.get(f"{srserver.url}/responses/{resp.id}"), 404)
    assert resp.id in err["message"]
    with pytest.raises(openai.NotFoundError) as e:
        create(srclient, previous_response_id=resp.id, input="Hello?", max_output_tokens=16)
    assert e.value.body["param"] == "previous_response_id"


def test_store_false_keeps_nothing(srclient, srserver):
    resp, body = create(srclient, input="Say hi.", max_output_tokens=16, store=False)
    assert body["store"] is False and resp.status in ("completed", "incomplete")
    error_of(httpx.get(f"{srserver.url}/responses/{resp.id}"), 404)
    error_of(httpx.get(f"{srserver.url}/responses/{resp.id}/input_items"), 404)
    with pytest.raises(openai.NotFoundError):
        create(srclient, previous_response_id=resp.id, input="Hello?", max_output_tokens=16)


def test_input_items_pagination(srclient, srserver):
    texts = [f"Fact {i}: the sky is blue." for i in range(5)]
    resp, _ = create(srclient, input=[{"role": "user", "content": t} for t in texts], max_output_tokens=16)
    url = f"{srserver.url}/responses/{resp.id}/input_items"
    every = httpx.get(url, params={"order": "asc"}).json()
    assert_valid("ResponseItemList", every)
    assert [i["content"][0]["text"] for i in every["data"]] == texts and every["has_more"] is False
    assert all(i["id"].startswith("msg_") and i["status"] == "completed" for i in every["data"])
    # page through newest first, two at a time, with the SDK's cursor
    pages, after = [], None
    while True:
        page = httpx.get(url, params={"limit": 2, **({"after": after} if after else {})}).json()
        assert_valid("ResponseItemList", page)
        pages.append([i["content"][0]["text"] for i in page["data"]])
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert pages == [texts[4:2:-1], texts[2:0:-1], texts[0:1]]
    auto = [i.content[0].text for i in srclient.responses.input_items.list(resp.id, limit=2, order="asc")]
    assert auto == texts   # the SDK follows has_more and last_id by itself
    err = error_of(httpx.get(url, params={"limit": 0}), 400)
    assert err["param"] == "limit"


def test_a_restart_keeps_stored_responses(srclient, scripted_host, make_server, scripted_data_dir):
    resp, body = create(srclient, input="Remember the word pineapple.", max_output_tokens=16,
                        metadata={"kept": "yes"})
    again = make_server(scripted_host, data_dir=str(scripted_data_dir))   # a second server on the same data folder
    client = openai_client(again)
    got = client.responses.with_raw_response.retrieve(resp.id).http_response.json()
    assert got == body
    follow, _ = create(client, previous_response_id=resp.id, input="Which word?", max_output_tokens=16)
    assert follow.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens


def test_objects_are_private_to_the_key_that_made_them(scripted_host, make_server, tmp_path):
    server = make_server(scripted_host, api_key="key-one", admin_key="key-two", data_dir=str(tmp_path))
    one, two = openai_client(server, api_key="key-one"), openai_client(server, api_key="key-two")
    resp, _ = create(one, input="Say hi.", max_output_tokens=16)
    conv = one.conversations.create()
    assert one.responses.retrieve(resp.id).id == resp.id
    for call in (lambda: two.responses.retrieve(resp.id), lambda: two.responses.input_items.list(resp.id),
                 lambda: two.responses.delete(resp.id), lambda: two.conversations.retrieve(conv.id),
                 lambda: create(two, previous_response_id=resp.id, input="Hi?", max_output_tokens=16)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert one.conversations.retrieve(conv.id).id == conv.id


def test_one_key_shares_every_object(scripted_host, make_server, tmp_path):
    server = make_server(scripted_host, api_key="only-key", data_dir=str(tmp_path))
    client = openai_client(server, api_key="only-key")
    resp, _ = create(client, input="Say hi.", max_output_tokens=16)
    assert client.responses.retrieve(resp.id).id == resp.id


def test_concurrent_requests_are_all_stored(srclient):
    from concurrent.futures import ThreadPoolExecutor

    def one(i):
        return create(srclient, input=f"Say the number {i}.", max_output_tokens=16, metadata={"i": str(i)})[1]

    with ThreadPoolExecutor(6) as pool:
        bodies = list(pool.map(one, range(6)))
    for i, body in enumerate(bodies):
        stored = srclient.responses.with_raw_response.retrieve(body["id"]).http_response.json()
        assert stored == body and stored["metadata"] == {"i": str(i)}
