"""The store's schema version: a data folder written before versions existed keeps its rows and
goes on working, migrations run once and in order, and a folder from a newer server is refused."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest
from support.responses_api import create
from support.servers import openai_client, run_together

from openai_ext.core import migrations
from openai_ext.core.migrations import SchemaTooNew, migrate
from openai_ext.responses import render
from openai_ext.responses.store import FILE, Store
from openai_ext.responses.store_schema import STEPS as MIGRATIONS

# The tables exactly as servers wrote them before the schema had a version (user_version 0).
# A fixture, not a copy to keep in step: it stands for data folders that already exist.
UNVERSIONED_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    status TEXT NOT NULL, previous_response_id TEXT, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_by_time ON responses(updated_at);
CREATE TABLE IF NOT EXISTS items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, response_id TEXT NOT NULL, item_id TEXT NOT NULL,
    role TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS items_by_response ON items(response_id, role, seq);
CREATE INDEX IF NOT EXISTS items_by_id ON items(item_id);
CREATE TABLE IF NOT EXISTS events (
    response_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (response_id, seq));
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    metadata TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS conversations_by_time ON conversations(updated_at);
CREATE TABLE IF NOT EXISTS conversation_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL, item_id TEXT NOT NULL,
    body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS conversation_items_by_id ON conversation_items(conversation_id, item_id);
"""

WRITTEN = int(time.time()) - 3600   # recent: retention by age keeps it
NAME = {"id": "msg_old_in", "type": "message", "role": "user", "status": "completed",
        "content": [{"type": "input_text", "text": "My name is Ada."}]}
REPLY = {"id": "msg_old_out", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Hello Ada.", "annotations": []}]}
OLD_RESPONSE = {"id": "resp_old", "object": "response", "created_at": WRITTEN, "status": "completed",
                "background": False, "completed_at": WRITTEN + 1, "error": None, "incomplete_details": None,
                "model": "SmolLM2", "output": [REPLY], "instructions": None, "max_output_tokens": 16,
                "max_tool_calls": None, "metadata": {"written": "before versions"}, "parallel_tool_calls": True,
                "previous_response_id": None, "prompt_cache_key": None,
                "reasoning": {"effort": None, "summary": None}, "safety_identifier": None, "service_tier": "default",
                "store": True, "temperature": 1.0, "text": {"format": {"type": "text"}, "verbosity": "medium"},
                "tool_choice": "auto", "tools": [], "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled",
                "conversation": None,
                "usage": {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                          "output_tokens": 4,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 34}}
REMARK = {"id": "msg_old_conv", "type": "message", "role": "user", "status": "completed",
          "content": [{"type": "input_text", "text": "Remember the word pineapple."}]}


def unversioned_folder(folder) -> None:
    """A data folder as a server wrote it before schema versions: a finished response with its
    input and output items and its events, and a conversation with one item."""
    folder.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(folder / FILE)
    conn.executescript(UNVERSIONED_SCHEMA)
    dump = json.dumps
    conn.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                 ("resp_old", "", WRITTEN, WRITTEN + 1, "completed", None, dump(OLD_RESPONSE)))
    conn.executemany("INSERT INTO items (response_id, item_id, role, body) VALUES (?, ?, ?, ?)",
                     [("resp_old", NAME["id"], "input", dump(NAME)), ("resp_old", REPLY["id"], "output", dump(REPLY))])
    conn.execute("INSERT INTO events VALUES (?, ?, ?)",
                 ("resp_old", 0, dump({"type": "response.created", "sequence_number": 0})))
    conn.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                 ("conv_old", "", WRITTEN, WRITTEN, dump({"topic": "fruit"})))
    conn.execute("INSERT INTO conversation_items (conversation_id, item_id, body) VALUES (?, ?, ?)",
                 ("conv_old", REMARK["id"], dump(REMARK)))
    conn.commit()
    assert conn.execute("PRAGMA user_version").fetchone() == (0,)
    conn.close()


def user_version(folder) -> int:
    conn = sqlite3.connect(folder / FILE)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


def test_an_unversioned_folder_keeps_its_rows_and_is_brought_up_to_date(tmp_path):
    unversioned_folder(tmp_path)
    store = Store(tmp_path)
    # read back with the fields the Response object gained since (their defaults)
    assert store.response("resp_old", None) == {**render.GAINED, **OLD_RESPONSE}
    assert store.input_items("resp_old", None) == [NAME]
    assert store.history("resp_old", None) == [NAME, REPLY]
    assert store.item("msg_old_out", None) == REPLY
    assert store.events("resp_old") == [{"type": "response.created", "sequence_number": 0}]
    assert store.conversation("conv_old", None)["metadata"] == {"topic": "fruit"}
    assert store.conversation_items("conv_old", None) == [REMARK]
    # and it goes on working: a response continuing the old one, an item added to the old conversation
    follow = {**OLD_RESPONSE, "id": "resp_new", "status": "in_progress", "previous_response_id": "resp_old",
              "output": []}
    store.put_response(follow, "", [{**NAME, "id": "msg_new_in"}])
    assert [it["id"] for it in store.history("resp_new", None)] == ["msg_old_in", "msg_old_out", "msg_new_in"]
    assert store.add_conversation_items("conv_old", None, [{**REMARK, "id": "msg_new_conv"}])
    assert [it["id"] for it in store.conversation_items("conv_old", None)] == ["msg_old_conv", "msg_new_conv"]
    store.close()
    assert user_version(tmp_path) == len(MIGRATIONS)


def test_a_new_folder_starts_at_the_latest_version(tmp_path):
    store = Store(tmp_path)
    store.put_conversation({"id": "conv_1", "created_at": 1, "metadata": {}}, "", [])
    store.close()
    assert user_version(tmp_path) == len(MIGRATIONS)


def test_a_folder_from_a_newer_server_is_refused_untouched(tmp_path):
    unversioned_folder(tmp_path)
    conn = sqlite3.connect(tmp_path / FILE)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.execute("UPDATE responses SET status = 'in_progress'")   # the sweep would mark it failed
    conn.commit()
    conn.close()
    store = Store(tmp_path)
    with pytest.raises(SchemaTooNew, match=rf"newer version.*schema version {len(MIGRATIONS) + 1}.*knows up to "
                                           rf"{len(MIGRATIONS)}"):
        store.response("resp_old", None)
    with pytest.raises(SchemaTooNew):   # every call, not only the first
        store.conversation("conv_old", None)
    store.close()
    conn = sqlite3.connect(tmp_path / FILE)
    assert conn.execute("SELECT status FROM responses").fetchall() == [("in_progress",)]
    assert conn.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS) + 1,)
    conn.close()


def test_migrations_run_in_order_once_and_in_one_transaction(tmp_path):
    ran = []

    def third(conn: sqlite3.Connection) -> None:
        ran.append(3)
        conn.execute("UPDATE t SET x = x + 1")

    steps = ["CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);",
             "ALTER TABLE t ADD COLUMN y TEXT DEFAULT 'two';\nUPDATE t SET x = x * 10;", third]
    conn = sqlite3.connect(tmp_path / "db", isolation_level=None)
    assert migrate(conn, steps[:2]) == 0
    assert migrations.version(conn) == 2 and ran == []
    assert migrate(conn, steps) == 2 and migrate(conn, steps) == 3
    assert ran == [3] and conn.execute("SELECT x, y FROM t").fetchall() == [(11, "two")]

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE t SET x = 0")
        raise ValueError("half done")

    with pytest.raises(ValueError):
        migrate(conn, [*steps, "CREATE TABLE u (z);", broken])
    # rolled back whole: neither the table of step 4 nor step 5's update, and still version 3
    assert migrations.version(conn) == 3 and not conn.in_transaction
    assert conn.execute("SELECT x FROM t").fetchall() == [(11,)]
    assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'u'").fetchall()
    conn.close()


def test_two_processes_opening_one_old_folder_at_once_migrate_it_once(tmp_path):
    unversioned_folder(tmp_path)
    counted = []
    steps = [*MIGRATIONS, lambda conn: counted.append(conn.execute("SELECT COUNT(*) FROM responses").fetchone())]
    barrier = threading.Barrier(4)

    def opener(_: int) -> None:
        conn = sqlite3.connect(tmp_path / FILE, isolation_level=None, timeout=10, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout=10000")
            barrier.wait()
            migrate(conn, steps)
        finally:
            conn.close()

    run_together(opener, 4)
    assert counted == [(1,)]   # one connection ran the new step, the others found it done
    assert user_version(tmp_path) == len(steps)


def test_an_unversioned_folder_goes_on_working_through_the_api(scripted_host, make_server, tmp_path):
    unversioned_folder(tmp_path)
    client = openai_client(make_server(scripted_host, data_dir=str(tmp_path)))
    old = client.responses.retrieve("resp_old")
    assert old.output_text == "Hello Ada." and old.metadata == {"written": "before versions"}
    assert [i.id for i in client.responses.input_items.list("resp_old")] == ["msg_old_in"]
    follow, body = create(client, previous_response_id="resp_old", input="What is my name?", max_output_tokens=16)
    assert body["previous_response_id"] == "resp_old"
    turns = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."},
             {"role": "user", "content": "What is my name?"}]
    assert follow.usage.input_tokens == len(scripted_host.tokenize(scripted_host.chat_prompt(turns).text))
    items = client.conversations.items.list("conv_old")
    assert [i.id for i in items.data] == ["msg_old_conv"]
