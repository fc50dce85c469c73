"""The store of responses and conversations: one SQLite database (the standard library's), in the
data folder.

- One connection, opened on first use (a server that never stores anything creates no file),
  shared by every thread under a lock; WAL journaling, so another process (a second server on the
  same folder) reads while this one writes, and ``busy_timeout`` makes writers wait for each other
  instead of failing. Every call is one transaction: a crash leaves each object whole or absent.
- Objects are JSON documents keyed by id, with the few columns queries need (owner, status,
  times, links). ``owner`` is a digest of the API key that made the object; a query passes
  ``owner=None`` when objects are shared (fewer than two keys).
- Retention: responses beyond ``max_stored`` (oldest first) and responses and conversations not
  updated for ``max_age_days`` are deleted, when the database opens and every so many writes.
- Responses still queued or running when their server stopped are marked failed when the
  database is next opened: nothing runs them any more.
- The schema is versioned: ``MIGRATIONS`` brings an older database forward when it opens, and a
  database written by a newer version of the server is refused (``SchemaTooNew``).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from ..core.migrations import Migration, migrate

log = logging.getLogger(__name__)

FILE = "responses.sqlite3"
PRUNE_EVERY = 64   # writes between two retention passes

SCHEMA = """
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

# The schema as forward migrations (see core/migrations.py): a change to the tables is a new step
# appended here, never an edit of one. Step 1 is the schema of before versions existed, all
# "IF NOT EXISTS": a data folder written then (version 0, the same tables) keeps its rows.
MIGRATIONS: list[Migration] = [SCHEMA]

STOPPED = {"code": "server_error", "message": "The server stopped before this response finished."}


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _transaction(conn: sqlite3.Connection, work, *, write: bool) -> Any:
    # IMMEDIATE takes the write lock at once: two writers wait for each other (busy_timeout)
    # instead of one failing halfway when the other commits first.
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        out = work(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return out


def _retrying(run, attempts: int = 5) -> Any:
    """``run()``, again when SQLite answers "locked" at once. busy_timeout makes a writer wait for
    another, but a few of WAL mode's locks (another connection opening the database or
    checkpointing it) are refused without waiting; the transaction was rolled back, so it is
    simply run again."""
    for attempt in range(attempts):
        try:
            return run()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or attempt == attempts - 1:
                raise
            time.sleep(0.01 * 2 ** attempt)


def _visible(row_owner: str, owner: str | None) -> bool:
    return owner is None or row_owner == owner


class Store:
    def __init__(self, folder: Path | str, *, max_stored: int = 0, max_age_days: float = 0):
        self.folder = Path(folder).expanduser()
        self.max_stored = max_stored
        self.max_age_days = max_age_days
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._writes = 0

    @property
    def path(self) -> Path:
        return self.folder / FILE

    # the connection ----------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError("the store is closed")
        if self._conn is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")   # WAL: durable at checkpoints, never corrupt
                conn.execute("PRAGMA busy_timeout=10000")
                migrate(conn, MIGRATIONS, what=str(self.path))
                _transaction(conn, self._sweep, write=True)
                _transaction(conn, self._prune, write=True)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            log.info("stored responses: %s", self.path)
        return self._conn

    def _run(self, work, *, write: bool = False) -> Any:
        """Runs ``work(conn)`` in one transaction, under the lock."""
        with self._lock:
            conn = _retrying(self._open)
            out = _retrying(lambda: _transaction(conn, work, write=write))
            if write:
                self._writes += 1
                if self._writes % PRUNE_EVERY == 0:
                    _transaction(conn, self._prune, write=True)
            return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # responses ---------------------------------------------------------------------------------
    def put_response(self, body: dict[str, Any], owner: str, input_items: list[dict[str, Any]]) -> None:
        """A new response (queued or in progress) and its input items."""
        def work(conn: sqlite3.Connection) -> None:
            now = time.time()
            conn.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (body["id"], owner, body["created_at"], now, body["status"],
                          body.get("previous_response_id"), _dump(body)))
            self._put_items(conn, body["id"], "input", input_items)
        self._run(work, write=True)

    @staticmethod
    def _put_items(conn: sqlite3.Connection, response_id: str, role: str, items: Iterable[dict[str, Any]]) -> None:
        conn.executemany("INSERT INTO items (response_id, item_id, role, body) VALUES (?, ?, ?, ?)",
                         [(response_id, it["id"], role, _dump(it)) for it in items])

    def save_response(self, body: dict[str, Any], *,
                      conversation: tuple[str, list[dict[str, Any]]] | None = None) -> None:
        """The response as it ended: its body, its output items, and the turn appended to its
        conversation."""
        def work(conn: sqlite3.Connection) -> None:
            now = time.time()
            found = conn.execute("UPDATE responses SET status = ?, updated_at = ?, body = ? WHERE id = ?",
                                 (body["status"], now, _dump(body), body["id"])).rowcount
            if not found:
                return   # deleted while it ran
            conn.execute("DELETE FROM items WHERE response_id = ? AND role = 'output'", (body["id"],))
            self._put_items(conn, body["id"], "output", body["output"])
            if conversation is not None:
                cid, turn_items = conversation
                if conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, cid)).rowcount:
                    self._add_conversation_items(conn, cid, turn_items)
        self._run(work, write=True)

    def put_events(self, response_id: str, events: list[dict[str, Any]]) -> None:
        """A background response's events, for streams that replay it after it ended."""
        def work(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,)).fetchone():
                conn.executemany("INSERT OR REPLACE INTO events VALUES (?, ?, ?)",
                                 [(response_id, e["sequence_number"], _dump(e)) for e in events])
        self._run(work, write=True)

    def response(self, response_id: str, owner: str | None) -> dict[str, Any] | None:
        row = self._run(lambda c: c.execute("SELECT owner, body FROM responses WHERE id = ?",
                                            (response_id,)).fetchone())
        return json.loads(row[1]) if row and _visible(row[0], owner) else None

    def delete_response(self, response_id: str, owner: str | None) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT owner FROM responses WHERE id = ?", (response_id,)).fetchone()
            if not row or not _visible(row[0], owner):
                return False
            conn.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            conn.execute("DELETE FROM items WHERE response_id = ?", (response_id,))
            conn.execute("DELETE FROM events WHERE response_id = ?", (response_id,))
            return True
        return self._run(work, write=True)

    def input_items(self, response_id: str, owner: str | None) -> list[dict[str, Any]] | None:
        def work(conn: sqlite3.Connection) -> list[dict[str, Any]] | None:
            row = conn.execute("SELECT owner FROM responses WHERE id = ?", (response_id,)).fetchone()
            if not row or not _visible(row[0], owner):
                return None
            rows = conn.execute("SELECT body FROM items WHERE response_id = ? AND role = 'input' ORDER BY seq",
                                (response_id,)).fetchall()
            return [json.loads(r[0]) for r in rows]
        return self._run(work)

    def history(self, response_id: str, owner: str | None) -> list[dict[str, Any]]:
        """Every item a continuation of ``response_id`` sees: the input and output items of it and
        of the responses it continued from, oldest first. A deleted link ends the chain."""
        def work(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            chain, seen, rid = [], set(), response_id
            while rid is not None and rid not in seen:
                row = conn.execute("SELECT owner, previous_response_id FROM responses WHERE id = ?", (rid,)).fetchone()
                if not row or not _visible(row[0], owner):
                    break
                seen.add(rid)
                chain.append(rid)
                rid = row[1]
            out = []
            for rid in reversed(chain):
                rows = conn.execute("SELECT body FROM items WHERE response_id = ? ORDER BY role = 'output', seq",
                                    (rid,)).fetchall()
                out += [json.loads(r[0]) for r in rows]
            return out
        return self._run(work)

    def item(self, item_id: str, owner: str | None) -> dict[str, Any] | None:
        """A stored item by id (for item_reference): the newest one the caller may see."""
        def work(conn: sqlite3.Connection) -> dict[str, Any] | None:
            rows = conn.execute("SELECT r.owner, i.body FROM items i JOIN responses r ON r.id = i.response_id "
                                "WHERE i.item_id = ? ORDER BY i.seq DESC", (item_id,)).fetchall()
            rows += conn.execute("SELECT c.owner, i.body FROM conversation_items i JOIN conversations c "
                                 "ON c.id = i.conversation_id WHERE i.item_id = ? ORDER BY i.seq DESC",
                                 (item_id,)).fetchall()
            return next((json.loads(body) for row_owner, body in rows if _visible(row_owner, owner)), None)
        return self._run(work)

    def events(self, response_id: str) -> list[dict[str, Any]]:
        rows = self._run(lambda c: c.execute("SELECT body FROM events WHERE response_id = ? ORDER BY seq",
                                             (response_id,)).fetchall())
        return [json.loads(r[0]) for r in rows]

    # conversations -----------------------------------------------------------------------------
    def put_conversation(self, conv: dict[str, Any], owner: str, items: list[dict[str, Any]]) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                         (conv["id"], owner, conv["created_at"], time.time(), _dump(conv["metadata"])))
            self._add_conversation_items(conn, conv["id"], items)
        self._run(work, write=True)

    @staticmethod
    def _add_conversation_items(conn: sqlite3.Connection, cid: str, items: list[dict[str, Any]]) -> None:
        conn.executemany("INSERT INTO conversation_items (conversation_id, item_id, body) VALUES (?, ?, ?)",
                         [(cid, it["id"], _dump(it)) for it in items])

    @staticmethod
    def _conversation(conn: sqlite3.Connection, cid: str, owner: str | None) -> dict[str, Any] | None:
        row = conn.execute("SELECT owner, created_at, metadata FROM conversations WHERE id = ?", (cid,)).fetchone()
        if not row or not _visible(row[0], owner):
            return None
        return {"id": cid, "object": "conversation", "created_at": int(row[1]), "metadata": json.loads(row[2])}

    def conversation(self, cid: str, owner: str | None) -> dict[str, Any] | None:
        return self._run(lambda c: self._conversation(c, cid, owner))

    def set_metadata(self, cid: str, owner: str | None, metadata: dict[str, Any]) -> dict[str, Any] | None:
        def work(conn: sqlite3.Connection) -> dict[str, Any] | None:
            if self._conversation(conn, cid, owner) is None:
                return None
            conn.execute("UPDATE conversations SET metadata = ?, updated_at = ? WHERE id = ?",
                         (_dump(metadata), time.time(), cid))
            return self._conversation(conn, cid, owner)
        return self._run(work, write=True)

    def delete_conversation(self, cid: str, owner: str | None) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            if self._conversation(conn, cid, owner) is None:
                return False
            conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))
            conn.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (cid,))
            return True
        return self._run(work, write=True)

    def add_conversation_items(self, cid: str, owner: str | None, items: list[dict[str, Any]]) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            if self._conversation(conn, cid, owner) is None:
                return False
            conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), cid))
            self._add_conversation_items(conn, cid, items)
            return True
        return self._run(work, write=True)

    def conversation_items(self, cid: str, owner: str | None) -> list[dict[str, Any]] | None:
        def work(conn: sqlite3.Connection) -> list[dict[str, Any]] | None:
            if self._conversation(conn, cid, owner) is None:
                return None
            rows = conn.execute("SELECT body FROM conversation_items WHERE conversation_id = ? ORDER BY seq",
                                (cid,)).fetchall()
            return [json.loads(r[0]) for r in rows]
        return self._run(work)

    def delete_conversation_item(self, cid: str, item_id: str, owner: str | None) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            if self._conversation(conn, cid, owner) is None:
                return False
            return conn.execute("DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                                (cid, item_id)).rowcount > 0
        return self._run(work, write=True)

    # upkeep ------------------------------------------------------------------------------------
    def _sweep(self, conn: sqlite3.Connection) -> None:
        rows = conn.execute("SELECT body FROM responses WHERE status IN ('queued', 'in_progress')").fetchall()
        for (raw,) in rows:
            body = json.loads(raw)
            body.update(status="failed", error=STOPPED)
            conn.execute("UPDATE responses SET status = 'failed', body = ? WHERE id = ?", (_dump(body), body["id"]))
        if rows:
            log.warning("%d stored responses were still running when their server stopped: marked failed", len(rows))

    def _prune(self, conn: sqlite3.Connection) -> None:
        """Applies the retention settings. Responses that still run are never pruned."""
        deleted = 0
        if self.max_age_days > 0:
            cutoff = time.time() - self.max_age_days * 86400
            deleted += conn.execute("DELETE FROM responses WHERE updated_at < ? AND status NOT IN "
                                    "('queued', 'in_progress')", (cutoff,)).rowcount
            old = [r[0] for r in conn.execute("SELECT id FROM conversations WHERE updated_at < ?", (cutoff,))]
            for cid in old:
                conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))
                conn.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (cid,))
        if self.max_stored > 0:
            deleted += conn.execute(
                "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE status NOT IN "
                "('queued', 'in_progress') ORDER BY created_at DESC LIMIT -1 OFFSET ?)", (self.max_stored,)).rowcount
        if deleted:
            conn.execute("DELETE FROM items WHERE response_id NOT IN (SELECT id FROM responses)")
            conn.execute("DELETE FROM events WHERE response_id NOT IN (SELECT id FROM responses)")
            log.info("retention: %d stored responses deleted", deleted)
