"""The SQLite store on its own: concurrent writers, two stores on one folder, retention, and the
responses a stopped server left running."""

from __future__ import annotations

import sqlite3
import threading
import time

from openai_ext.responses.store import PRUNE_EVERY, Store


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


def test_concurrent_writers_never_corrupt_it(tmp_path):
    stores = [Store(tmp_path), Store(tmp_path)]   # two servers on one folder: two connections
    errors = []

    def writer(w: int) -> None:
        store = stores[w % 2]
        try:
            for k in range(25):
                i = w * 100 + k
                store.put_response(response(i, "in_progress"), "", [item(i)])
                store.save_response(response(i))
                assert store.response(f"resp_{i}", None)["status"] == "completed"
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for store in stores:
        store.close()
    conn = sqlite3.connect(tmp_path / "responses.sqlite3")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert conn.execute("SELECT COUNT(*) FROM responses WHERE status = 'completed'").fetchone() == (200,)
    assert conn.execute("SELECT COUNT(*) FROM items").fetchone() == (400,)   # one input and one output each


def test_history_follows_the_chain_and_stops_at_a_deleted_link(tmp_path):
    store = Store(tmp_path)
    for i in range(1, 4):
        store.put_response(response(i, "in_progress", f"resp_{i - 1}" if i > 1 else None), "", [item(i)])
        store.save_response(response(i, previous=f"resp_{i - 1}" if i > 1 else None))
    assert [it["id"] for it in store.history("resp_3", None)] == [
        "msg_in_1", "msg_out_1", "msg_in_2", "msg_out_2", "msg_in_3", "msg_out_3"]
    assert store.delete_response("resp_2", None)
    assert [it["id"] for it in store.history("resp_3", None)] == ["msg_in_3", "msg_out_3"]
    assert store.history("resp_3", "someone else") == []
    store.close()


def test_retention_by_count_and_by_age(tmp_path, monkeypatch):
    store = Store(tmp_path, max_stored=5)
    n = PRUNE_EVERY // 2   # two writes per response: a retention pass runs after the last one
    for i in range(n):
        store.put_response(response(i, "in_progress"), "", [item(i)])
        store.save_response(response(i))
    kept = [i for i in range(n) if store.response(f"resp_{i}", None)]
    assert kept == list(range(n - 5, n))
    assert store.item("msg_in_0", None) is None and store.item(f"msg_in_{kept[-1]}", None)
    store.close()

    old = Store(tmp_path, max_age_days=1)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 2 * 86400)   # two days later, it opens again
    assert old.response(f"resp_{kept[-1]}", None) is None
    old.close()


def test_responses_left_running_are_marked_failed_when_it_opens_again(tmp_path):
    store = Store(tmp_path)
    store.put_response(response(1, "in_progress"), "", [item(1)])
    store.put_response(response(2, "queued"), "", [item(2)])
    store.close()
    again = Store(tmp_path)
    for rid in ("resp_1", "resp_2"):
        body = again.response(rid, None)
        assert body["status"] == "failed" and body["error"]["code"] == "server_error"
    again.close()


def test_owners(tmp_path):
    store = Store(tmp_path)
    store.put_response(response(1, "in_progress"), "owner-a", [item(1)])
    assert store.response("resp_1", "owner-a") and store.response("resp_1", None)
    assert store.response("resp_1", "owner-b") is None
    assert store.item("msg_in_1", "owner-b") is None and store.item("msg_in_1", "owner-a")
    assert not store.delete_response("resp_1", "owner-b")
    store.close()
