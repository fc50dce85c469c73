"""The store on its own, on both backends (SQLite, and PostgreSQL where the tests can start one):
concurrent writers, two stores on one folder or database, retention, and the responses a stopped
server left running."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from support.servers import run_together, wait_until

from openai_ext.responses.store import PRUNE_EVERY, Store


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request, tmp_path):
    """Stores on one place: a data folder, or a new PostgreSQL database."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    made = []

    def make(**kw) -> Store:
        store = Store(tmp_path, database_url=url, **kw)
        made.append(store)
        return store

    make.backend = request.param
    yield make
    for store in made:
        store.close()


def response(i: int, status: str = "completed", previous: str | None = None) -> dict:
    return {"id": f"resp_{i}", "object": "response", "created_at": 1000 + i, "status": status,
            "previous_response_id": previous, "output": [{"id": f"msg_out_{i}", "type": "message", "role": "assistant",
                                                          "status": "completed", "content": []}]}


def item(i: int) -> dict:
    return {"id": f"msg_in_{i}", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": f"question {i}"}]}


def test_nothing_is_created_until_something_is_stored(tmp_path):
    store = Store(tmp_path / "data")
    assert not (tmp_path / "data").exists()
    store.put_response(response(1, "in_progress"), "", [item(1)])
    assert store.path.exists()
    store.close()


def test_concurrent_writers_never_corrupt_it(make_store, tmp_path):
    # two servers on one folder or database: two connections. The subject is integrity, not the
    # deadline: on a loaded machine eight writers may wait on each other longer than the default.
    stores = [make_store(timeout=120), make_store(timeout=120)]

    def writer(w: int) -> None:
        store = stores[w % 2]
        for k in range(25):
            i = w * 100 + k
            store.put_response(response(i, "in_progress"), "", [item(i)])
            store.save_response(response(i))
            assert store.response(f"resp_{i}", None)["status"] == "completed"

    run_together(writer, 8)
    assert all(len(stores[1].history(f"resp_{w * 100 + k}", None)) == 2 for w in range(8) for k in range(25))
    for store in stores:
        store.close()
    if make_store.backend != "sqlite":
        return
    conn = sqlite3.connect(tmp_path / "responses.sqlite3")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert conn.execute("SELECT COUNT(*) FROM responses WHERE status = 'completed'").fetchone() == (200,)
    assert conn.execute("SELECT COUNT(*) FROM items").fetchone() == (400,)   # one input and one output each


def test_history_follows_the_chain_and_stops_at_a_deleted_link(make_store):
    store = make_store()
    for i in range(1, 4):
        store.put_response(response(i, "in_progress", f"resp_{i - 1}" if i > 1 else None), "", [item(i)])
        store.save_response(response(i, previous=f"resp_{i - 1}" if i > 1 else None))
    assert [it["id"] for it in store.history("resp_3", None)] == [
        "msg_in_1", "msg_out_1", "msg_in_2", "msg_out_2", "msg_in_3", "msg_out_3"]
    assert store.delete_response("resp_2", None)
    assert [it["id"] for it in store.history("resp_3", None)] == ["msg_in_3", "msg_out_3"]
    assert store.history("resp_3", "someone else") == []
    store.close()


def test_retention_by_count_and_by_age(make_store, monkeypatch):
    store = make_store(max_stored=5)
    n = PRUNE_EVERY // 2   # two writes per response: a retention pass is due after the last one
    for i in range(n):
        store.put_response(response(i, "in_progress"), "", [item(i)])
        store.save_response(response(i))
    # the store's own thread prunes, off the requests' path
    wait_until(lambda: store.response("resp_0", None) is None, "the retention pass", tries=600)
    kept = [i for i in range(n) if store.response(f"resp_{i}", None)]
    assert kept == list(range(n - 5, n))
    assert store.item("msg_in_0", None) is None and store.item(f"msg_in_{kept[-1]}", None)
    store.close()

    old = make_store(max_age_days=1)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 2 * 86400)   # two days later, it opens again
    assert old.response(f"resp_{kept[-1]}", None) is None
    old.close()


def test_responses_left_running_are_marked_failed_when_it_opens_again(make_store):
    store = make_store()
    store.put_response(response(1, "in_progress"), "", [item(1)])
    store.put_response(response(2, "queued"), "", [item(2)])
    store.close()
    again = make_store()
    for rid in ("resp_1", "resp_2"):
        body = again.response(rid, None)
        assert body["status"] == "failed" and body["error"]["code"] == "server_error"
    again.close()


def test_owners(make_store):
    store = make_store()
    store.put_response(response(1, "in_progress"), "owner-a", [item(1)])
    assert store.response("resp_1", "owner-a") and store.response("resp_1", None)
    assert store.response("resp_1", "owner-b") is None
    assert store.item("msg_in_1", "owner-b") is None and store.item("msg_in_1", "owner-a")
    assert not store.delete_response("resp_1", "owner-b")
    store.close()


def test_every_operation(make_store):
    store = make_store()
    store.put_response(response(1, "in_progress"), "", [item(1)])
    assert store.input_items("resp_1", None) == [item(1)] and store.input_items("resp_9", None) is None
    store.put_events("resp_1", [{"type": "response.created", "sequence_number": 0},
                                {"type": "response.completed", "sequence_number": 1}])
    store.put_events("resp_1", [{"type": "response.completed", "sequence_number": 1, "again": True}])
    assert store.events("resp_1")[1] == {"type": "response.completed", "sequence_number": 1, "again": True}
    store.put_events("resp_9", [{"type": "x", "sequence_number": 0}])   # no such response: nothing kept
    assert store.events("resp_9") == []
    store.save_response(response(1))
    assert store.response("resp_1", None)["status"] == "completed"
    assert store.item("msg_out_1", None)["role"] == "assistant"

    conv = {"id": "conv_1", "object": "conversation", "created_at": 5, "metadata": {"a": "b"}}
    store.put_conversation(conv, "", [item(2)])
    assert store.conversation("conv_1", None) == conv and store.conversation("conv_1", "other") is None
    assert store.set_metadata("conv_1", None, {"c": "d"})["metadata"] == {"c": "d"}
    assert store.set_metadata("conv_9", None, {}) is None
    assert store.add_conversation_items("conv_1", None, [item(3), item(4)])
    assert not store.add_conversation_items("conv_9", None, [item(5)])
    # a response in the conversation appends its turn (input and output) when it is saved
    store.put_response(response(6, "in_progress"), "", [item(6)])
    store.save_response(response(6), conversation=("conv_1", [item(6), *response(6)["output"]]))
    assert [i["id"] for i in store.conversation_items("conv_1", None)] == [
        "msg_in_2", "msg_in_3", "msg_in_4", "msg_in_6", "msg_out_6"]
    assert store.item("msg_in_3", None) == item(3)
    assert store.delete_conversation_item("conv_1", "msg_in_3", None)
    assert not store.delete_conversation_item("conv_1", "msg_in_3", None)
    assert store.delete_conversation("conv_1", None) and store.conversation_items("conv_1", None) is None
    assert not store.delete_conversation("conv_1", None)

    assert store.delete_response("resp_1", None) and not store.delete_response("resp_1", None)
    assert store.response("resp_1", None) is None and store.events("resp_1") == []


def test_a_store_opening_leaves_a_live_servers_responses_alone(make_store):
    first = make_store()
    first.put_response(response(1, "in_progress"), "", [item(1)])
    second = make_store()   # another server starts on the same store: it sweeps
    assert second.response("resp_1", None)["status"] == "in_progress"
    # the first one dies without closing: once its heartbeat is older than the lease, a sweep fails its responses
    first._stop.set()
    second.db.run(lambda c: c.execute("UPDATE instances SET heartbeat_at = heartbeat_at - 3600 WHERE id = ?",
                                      (first.instance_id,)), write=True)
    second.db.run(second._sweep_, write=True)
    body = second.response("resp_1", None)
    assert body["status"] == "failed" and body["error"]["code"] == "server_error"


def test_a_cancel_reaches_the_server_that_runs_the_response(make_store):
    runner, other = make_store(), make_store()
    runner.put_response(response(1, "in_progress"), "", [item(1)])
    runner.put_response(response(2, "queued"), "", [item(2)])
    assert runner.stopping(["resp_1", "resp_2"]) == set()
    assert other.request_cancel("resp_1", None) == "asked"
    assert runner.stopping(["resp_1", "resp_2"]) == {"resp_1"}
    assert other.delete_response("resp_2", None)
    assert runner.stopping(["resp_1", "resp_2"]) == {"resp_1", "resp_2"}   # deleted: stop it too
    runner.save_response(response(1, "cancelled"))
    assert other.request_cancel("resp_1", None) == "ended"
    assert other.request_cancel("resp_9", None) == "missing"
    # a response whose server is gone is cancelled by whoever asks
    runner.put_response(response(3, "in_progress"), "", [item(3)])
    runner.close()
    other.db.run(lambda c: c.execute("UPDATE responses SET status = 'in_progress' WHERE id = 'resp_3'"), write=True)
    assert other.request_cancel("resp_3", None) == "cancelled"
    assert other.response("resp_3", None)["status"] == "cancelled"


def test_two_servers_appending_to_one_conversation_at_once_keep_every_turn_in_order(make_store):
    stores = [make_store(), make_store()]
    stores[0].put_conversation({"id": "conv_1", "created_at": 1, "metadata": {}}, "", [])
    barrier = threading.Barrier(2)

    def append(w: int) -> None:
        barrier.wait()
        for k in range(20):
            turn = [{**item(0), "id": f"msg_{w}_{k}_{part}"} for part in range(3)]
            assert stores[w].add_conversation_items("conv_1", None, turn)

    run_together(append, 2)
    ids = [i["id"] for i in stores[1].conversation_items("conv_1", None)]
    assert len(ids) == 120
    turns = [ids[i:i + 3] for i in range(0, 120, 3)]
    for turn in turns:   # each turn whole, its items together and in order
        w, k = turn[0].split("_")[1:3]
        assert turn == [f"msg_{w}_{k}_{part}" for part in range(3)]
    for w in "01":   # and each server's turns in the order it sent them
        assert [t[0].split("_")[2] for t in turns if t[0].split("_")[1] == w] == [str(k) for k in range(20)]
