"""The store of responses and conversations: one interface (``Store``), two backends.

- SQLite in the data folder (store_sqlite.py) is the default and needs no set-up;
  ``database_url`` (postgresql://...) puts the store in PostgreSQL (store_postgres.py), which
  several servers can share. The SQL below is shared by both (``?`` placeholders, standard
  upserts); each backend brings its connection, its transactions, its schema and the SQL of its
  clock (``now``).
- Every call is one transaction: a crash leaves each object whole or absent.
- Objects are JSON documents keyed by id, with the few columns queries need (owner, status,
  times, links). ``owner`` is a digest of the API key that made the object; a query passes
  ``owner=None`` when objects are shared (fewer than two keys).
- Retention: responses beyond ``max_stored`` (oldest first) and responses and conversations not
  updated for ``max_age_days`` are deleted, when the store opens and every so many writes.
- Several servers on one store: each is an instance (a row in ``instances`` with a heartbeat
  every ``HEARTBEAT_S``), and each response names the instance that runs it. Responses still
  queued or running whose instance stopped (closed, or silent for ``LEASE_S``) are marked failed:
  when a store opens, and every ``SWEEP_EVERY`` heartbeats; a live instance's are never touched.
  Cancelling a response another instance runs sets ``cancel_requested``, which that instance
  polls (``stopping``); a response whose instance is dead is marked cancelled at once.
- The schema is versioned: each backend's ``MIGRATIONS`` bring an older database forward when it
  opens, and a database written by a newer version of the server is refused (``SchemaTooNew``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, TypeVar

from . import store_upkeep as upkeep
from .store_sqlite import FILE, MIGRATIONS, SqliteDatabase
from .store_upkeep import RUNNING
from .store_upkeep import dump as _dump

__all__ = ["FILE", "MIGRATIONS", "PRUNE_EVERY", "Store"]

log = logging.getLogger(__name__)

T = TypeVar("T")
PRUNE_EVERY = 64    # writes between two retention passes
HEARTBEAT_S = 5.0   # an instance's heartbeat
LEASE_S = 30.0      # an instance silent for longer is dead: its running responses are failed
SWEEP_EVERY = 6     # heartbeats between two sweeps for dead instances' responses


class Database(Protocol):
    """A backend: its transactions, and the SQL of its clock in seconds since 1970."""

    now: str

    @property
    def what(self) -> str: ...

    def open(self) -> None: ...
    def run(self, work: Callable[[Any], T], *, write: bool = False) -> T: ...
    def close(self) -> None: ...


def _visible(row_owner: str, owner: str | None) -> bool:
    return owner is None or row_owner == owner


class Store:
    def __init__(self, folder: Path | str | None = None, *, max_stored: int = 0, max_age_days: float = 0,
                 database_url: str = ""):
        self.db: Database
        if database_url:
            from .store_postgres import PostgresDatabase
            self.db = PostgresDatabase(database_url)
        elif folder is not None:
            self.db = SqliteDatabase(folder)
        else:
            raise ValueError("a store needs a data folder or a database_url")
        self.max_stored = max_stored
        self.max_age_days = max_age_days
        self.instance_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._opened = False
        self._closed = False
        self._writes = 0
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    @property
    def path(self) -> Path:
        """The SQLite file (the default backend)."""
        assert isinstance(self.db, SqliteDatabase), "only the SQLite store has a file"
        return self.db.path

    @property
    def what(self) -> str:
        """Where the store is, for logs (a URL's password masked)."""
        return self.db.what

    # opening and closing ---------------------------------------------------------------------
    def open(self) -> None:
        """Connects, migrates, registers this instance and sweeps; done on first use otherwise.
        A server with database_url opens at start, so a database it cannot use stops it there."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the store is closed")
            if self._opened:
                return
            self.db.open()
            self.db.run(self._register_, write=True)
            self.db.run(self._sweep_, write=True)
            self.db.run(self._prune_, write=True)
            self._opened = True
            self._heart = threading.Thread(target=self._beat, name="store-heartbeat", daemon=True)
            self._heart.start()
            log.info("stored responses: %s", self.db.what)

    def _run(self, work: Callable[[Any], T], *, write: bool = False) -> T:
        """Runs ``work(conn)`` in one transaction."""
        if not self._opened:
            self.open()
        out = self.db.run(work, write=write)
        if write:
            with self._lock:
                self._writes += 1
                prune = self._writes % PRUNE_EVERY == 0
            if prune:
                self.db.run(self._prune_, write=True)
        return out

    def close(self) -> None:
        """Stops the heartbeat; this instance's responses that still run are marked failed (it
        will not finish them) and its instance row is removed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if self._opened:
                try:
                    self.db.run(self._retire_, write=True)
                except Exception as e:  # noqa: BLE001 - the next store to open sweeps them
                    log.warning("the store could not be closed cleanly (%s)", type(e).__name__)
            self.db.close()
        if self._heart is not None and self._heart is not threading.current_thread():
            self._heart.join(timeout=HEARTBEAT_S)

    # responses ---------------------------------------------------------------------------------
    def put_response(self, body: dict[str, Any], owner: str, input_items: list[dict[str, Any]]) -> None:
        """A new response (queued or in progress) and its input items."""
        def work(conn: Any) -> None:
            now = time.time()
            conn.execute("INSERT INTO responses (id, owner, created_at, updated_at, status, previous_response_id, "
                         "body, instance) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                         "owner = excluded.owner, updated_at = excluded.updated_at, status = excluded.status, "
                         "body = excluded.body, instance = excluded.instance",
                         (body["id"], owner, body["created_at"], now, body["status"],
                          body.get("previous_response_id"), _dump(body), self.instance_id))
            self._put_items(conn, body["id"], "input", input_items)
        self._run(work, write=True)

    @staticmethod
    def _put_items(conn: Any, response_id: str, role: str, items: Iterable[dict[str, Any]]) -> None:
        conn.executemany("INSERT INTO items (response_id, item_id, role, body) VALUES (?, ?, ?, ?)",
                         [(response_id, it["id"], role, _dump(it)) for it in items])

    def save_response(self, body: dict[str, Any], *,
                      conversation: tuple[str, list[dict[str, Any]]] | None = None) -> None:
        """The response as it ended: its body, its output items, and the turn appended to its
        conversation."""
        def work(conn: Any) -> None:
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
        def work(conn: Any) -> None:
            if conn.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,)).fetchone():
                conn.executemany("INSERT INTO events VALUES (?, ?, ?) ON CONFLICT (response_id, seq) "
                                 "DO UPDATE SET body = excluded.body",
                                 [(response_id, e["sequence_number"], _dump(e)) for e in events])
        self._run(work, write=True)

    def response(self, response_id: str, owner: str | None) -> dict[str, Any] | None:
        row = self._run(lambda c: c.execute("SELECT owner, body FROM responses WHERE id = ?",
                                            (response_id,)).fetchone())
        return json.loads(row[1]) if row and _visible(row[0], owner) else None

    def delete_response(self, response_id: str, owner: str | None) -> bool:
        def work(conn: Any) -> bool:
            row = conn.execute("SELECT owner FROM responses WHERE id = ?", (response_id,)).fetchone()
            if not row or not _visible(row[0], owner):
                return False
            conn.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            conn.execute("DELETE FROM items WHERE response_id = ?", (response_id,))
            conn.execute("DELETE FROM events WHERE response_id = ?", (response_id,))
            return True
        return self._run(work, write=True)

    def input_items(self, response_id: str, owner: str | None) -> list[dict[str, Any]] | None:
        def work(conn: Any) -> list[dict[str, Any]] | None:
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
        def work(conn: Any) -> list[dict[str, Any]]:
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
        def work(conn: Any) -> dict[str, Any] | None:
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
        def work(conn: Any) -> None:
            conn.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                         (conv["id"], owner, conv["created_at"], time.time(), _dump(conv["metadata"])))
            self._add_conversation_items(conn, conv["id"], items)
        self._run(work, write=True)

    @staticmethod
    def _add_conversation_items(conn: Any, cid: str, items: list[dict[str, Any]]) -> None:
        conn.executemany("INSERT INTO conversation_items (conversation_id, item_id, body) VALUES (?, ?, ?)",
                         [(cid, it["id"], _dump(it)) for it in items])

    @staticmethod
    def _conversation(conn: Any, cid: str, owner: str | None) -> dict[str, Any] | None:
        row = conn.execute("SELECT owner, created_at, metadata FROM conversations WHERE id = ?", (cid,)).fetchone()
        if not row or not _visible(row[0], owner):
            return None
        return {"id": cid, "object": "conversation", "created_at": int(row[1]), "metadata": json.loads(row[2])}

    def conversation(self, cid: str, owner: str | None) -> dict[str, Any] | None:
        return self._run(lambda c: self._conversation(c, cid, owner))

    def set_metadata(self, cid: str, owner: str | None, metadata: dict[str, Any]) -> dict[str, Any] | None:
        def work(conn: Any) -> dict[str, Any] | None:
            if self._conversation(conn, cid, owner) is None:
                return None
            conn.execute("UPDATE conversations SET metadata = ?, updated_at = ? WHERE id = ?",
                         (_dump(metadata), time.time(), cid))
            return self._conversation(conn, cid, owner)
        return self._run(work, write=True)

    def delete_conversation(self, cid: str, owner: str | None) -> bool:
        def work(conn: Any) -> bool:
            if self._conversation(conn, cid, owner) is None:
                return False
            conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))
            conn.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (cid,))
            return True
        return self._run(work, write=True)

    def add_conversation_items(self, cid: str, owner: str | None, items: list[dict[str, Any]]) -> bool:
        def work(conn: Any) -> bool:
            if self._conversation(conn, cid, owner) is None:
                return False
            conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), cid))
            self._add_conversation_items(conn, cid, items)
            return True
        return self._run(work, write=True)

    def conversation_items(self, cid: str, owner: str | None) -> list[dict[str, Any]] | None:
        def work(conn: Any) -> list[dict[str, Any]] | None:
            if self._conversation(conn, cid, owner) is None:
                return None
            rows = conn.execute("SELECT body FROM conversation_items WHERE conversation_id = ? ORDER BY seq",
                                (cid,)).fetchall()
            return [json.loads(r[0]) for r in rows]
        return self._run(work)

    def delete_conversation_item(self, cid: str, item_id: str, owner: str | None) -> bool:
        def work(conn: Any) -> bool:
            if self._conversation(conn, cid, owner) is None:
                return False
            return conn.execute("DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                                (cid, item_id)).rowcount > 0
        return self._run(work, write=True)

    # several instances -------------------------------------------------------------------------
    def progress(self, body: dict[str, Any]) -> None:
        """A queued response began to run: its status for the other instances to see."""
        self._run(lambda c: c.execute("UPDATE responses SET status = ?, updated_at = ?, body = ? WHERE id = ? AND "
                                      "status = 'queued'", (body["status"], time.time(), _dump(body), body["id"])),
                  write=True)

    def request_cancel(self, response_id: str, owner: str | None) -> str:
        """Asks the instance that runs a response to stop it: "asked"; "cancelled" when that
        instance is dead (marked cancelled here); "ended" when it no longer runs; "missing"."""
        def work(conn: Any) -> str:
            row = conn.execute("SELECT owner, status, instance, body FROM responses WHERE id = ?",
                               (response_id,)).fetchone()
            if not row or not _visible(row[0], owner):
                return "missing"
            if row[1] not in ("queued", "in_progress"):
                return "ended"
            if row[2] is not None and conn.execute(
                    f"SELECT 1 FROM instances WHERE id = ? AND heartbeat_at >= {self.db.now} - ?",
                    (row[2], LEASE_S)).fetchone():
                conn.execute("UPDATE responses SET cancel_requested = 1 WHERE id = ?", (response_id,))
                return "asked"
            body = dict(json.loads(row[3]), status="cancelled")
            conn.execute(f"UPDATE responses SET status = 'cancelled', body = ?, updated_at = ? WHERE id = ? AND "
                         f"status IN {RUNNING}", (_dump(body), time.time(), response_id))
            return "cancelled"
        return self._run(work, write=True)

    def stopping(self, response_ids: list[str]) -> set[str]:
        """Which of these responses (run here) must stop: another instance asked to cancel them,
        or they were deleted."""
        if not response_ids:
            return set()
        marks = ", ".join("?" * len(response_ids))
        rows = self._run(lambda c: c.execute(f"SELECT id, cancel_requested FROM responses WHERE id IN ({marks})",
                                             response_ids).fetchall())
        kept = {r[0] for r in rows if not r[1]}
        return set(response_ids) - kept

    def _beat(self) -> None:
        beats = 0
        while not self._stop.wait(HEARTBEAT_S):
            beats += 1
            try:
                self.db.run(self._register_, write=True)
                if beats % SWEEP_EVERY == 0:
                    self.db.run(self._sweep_, write=True)
            except RuntimeError:
                return   # closed
            except Exception as e:  # noqa: BLE001 - the database may come back: the next beat tries again
                log.warning("the store's heartbeat failed (%s); trying again in %g s", e, HEARTBEAT_S)

    # upkeep (store_upkeep.py) -------------------------------------------------------------------
    def _register_(self, conn: Any) -> None:
        upkeep.register(conn, self.db.now, self.instance_id)

    def _sweep_(self, conn: Any) -> None:
        upkeep.sweep(conn, self.db.now, LEASE_S)

    def _retire_(self, conn: Any) -> None:
        upkeep.retire(conn, self.instance_id)

    def _prune_(self, conn: Any) -> None:
        upkeep.prune(conn, self.max_stored, self.max_age_days)
