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
- The schema is versioned: one list of named steps for both databases (store_schema.STEPS)
  brings an older database forward when it opens, and a database written by a newer version of
  the server is refused (``SchemaTooNew``).
- Every call has a deadline (``timeout``: the database_timeout setting) that the backend enforces
  whatever the database does, and ``health`` (store_health.py) turns the calls' failures into a
  prompt 503 for the requests that need the store while it is down.
- Nothing a client was told is lost: a response this instance runs is ``claim``ed before its row is
  written and ``settle``d at its end, the final write made before the client is told. A final
  write that fails raises (the client is told the response failed, naming the store) and is kept
  (``owed``) to be written, as failed, as soon as the store answers again; and every
  ``SWEEP_EVERY`` heartbeats this instance fails its own rows still queued or in progress that it
  no longer runs. So no row stays queued or in progress for long after the store is back,
  whatever failed.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

from . import store_upkeep as upkeep
from .item_types import Items
from .store_conversations import ConversationRows
from .store_health import StoreHealth, StoreUnavailable
from .store_responses import ResponseRows
from .store_sqlite import FILE, SqliteDatabase
from .store_upkeep import RUNNING, visible
from .store_upkeep import dump as _dump

__all__ = ["FILE", "LEASE_S", "PRUNE_EVERY", "Store"]

log = logging.getLogger(__name__)

T = TypeVar("T")
PRUNE_EVERY = 64    # writes between two retention passes
HEARTBEAT_S = 5.0   # an instance's heartbeat
PROBE_S = 1.0       # the heartbeat's pace while the store is down, or writes are owed to it
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


_visible = visible


class Store(ResponseRows, ConversationRows):
    def __init__(self, folder: Path | str | None = None, *, max_stored: int = 0, max_age_days: float = 0,
                 database_url: str = "", timeout: float = 5.0):
        self.db: Database
        if database_url:
            from .store_postgres import PostgresDatabase
            self.db = PostgresDatabase(database_url, timeout=timeout)
        elif folder is not None:
            self.db = SqliteDatabase(folder, timeout=timeout)
        else:
            raise ValueError("a store needs a data folder or a database_url")
        self.max_stored = max_stored
        self.max_age_days = max_age_days
        self.instance_id = uuid.uuid4().hex
        self.timeout = timeout
        self.health = StoreHealth(self.db.what)
        self._lock = threading.Lock()      # the sets below; never held over a call to the database
        self._opening = threading.Lock()   # opening and closing
        self._opened = False
        self._closed = False
        self._writes = 0
        self._stop = threading.Event()
        self._wake = threading.Event()   # the heartbeat's next beat now: closing, or a prune is due
        self._heart: threading.Thread | None = None
        self._running: set[str] = set()              # responses this instance runs (claimed, not settled)
        self._owed: dict[str, dict[str, Any]] = {}   # final bodies whose write failed, to write when it can

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
        if not self._opening.acquire(timeout=self.timeout):   # another caller is opening it, slowly
            raise StoreUnavailable(f"The store of responses ({self.db.what}) is still being opened after "
                                   f"{self.timeout:g} s (database_timeout); retrying may help.")
        try:
            if self._closed:
                raise RuntimeError("the store is closed")
            if self._opened:
                return
            if self._heart is None:
                # started whether or not this first try works: while it does not, the heartbeat
                # tries again every second, so the store is found by itself once it answers
                self._heart = threading.Thread(target=self._beat, name="store-heartbeat", daemon=True)
                self._heart.start()
            self.db.open()
            self.db.run(self._register_, write=True)
            self.db.run(self._sweep_, write=True)
            self.db.run(self._prune_, write=True)
            self._opened = True
            log.info("stored responses: %s", self.db.what)
        finally:
            self._opening.release()

    def _run(self, work: Callable[[Any], T], *, write: bool = False) -> T:
        """Runs ``work(conn)`` in one transaction, within the deadline; while the store is known to
        be down, raises its StoreUnavailable at once (store_health.py)."""
        self.health.check()
        try:
            if not self._opened:
                self.open()
            out = self.db.run(work, write=write)
        except StoreUnavailable as e:
            self.health.failed(e)
            raise
        self.health.ok()
        if write:
            with self._lock:
                self._writes += 1   # the heartbeat prunes every PRUNE_EVERY writes, off the requests' path
                if self._writes >= PRUNE_EVERY:
                    self._wake.set()
        return out

    def exists(self) -> bool:
        """Whether there is a store to read yet: a PostgreSQL database, or the SQLite file once
        something was stored (looking must not make an empty one)."""
        return not isinstance(self.db, SqliteDatabase) or self.db.path.exists()

    def run(self, work: Callable[[Any], T], *, write: bool = False) -> T:
        """``work(conn)`` in one transaction (``?`` placeholders on both backends), within the
        deadline: the way in for the other families' tables (the Files API's)."""
        return self._run(work, write=write)

    def close(self) -> None:
        """Stops the heartbeat; this instance's responses that still run are marked failed (it
        will not finish them) and its instance row is removed."""
        with self._opening:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            self._wake.set()
            if self._opened:
                try:
                    self.db.run(self._retire_, write=True)
                except Exception as e:  # noqa: BLE001 - the next store to open sweeps them
                    log.warning("the store could not be closed cleanly (%s)", type(e).__name__)
            self.db.close()
        if self._heart is not None and self._heart is not threading.current_thread():
            self._heart.join(timeout=HEARTBEAT_S)

    # what this instance runs, and owes the store ------------------------------------------------
    def claim(self, response_id: str) -> None:
        """This instance runs ``response_id`` (called before its row is written)."""
        with self._lock:
            self._running.add(response_id)

    def release(self, response_id: str) -> None:
        """It no longer runs here, and its row says how it ended (or it never had one)."""
        with self._lock:
            self._running.discard(response_id)

    def settle(self, body: dict[str, Any], conversation: tuple[str, Items] | None,
               lost: Callable[[StoreUnavailable], dict[str, Any]], output: Items | None = None) -> None:
        """Writes a response as it ended. When the write fails, the StoreUnavailable is raised, and
        ``lost(error)`` (the body the client is then shown: failed, naming the store) is owed to the
        store: written by the heartbeat as soon as the store answers again."""
        try:
            self.save_response(body, conversation=conversation, output=output)
        except StoreUnavailable as e:
            with self._lock:
                self._owed[body["id"]] = lost(e)
            self._wake.set()   # the heartbeat now beats every PROBE_S until it is paid
            raise
        finally:
            self.release(body["id"])

    def _pay(self) -> None:
        """Writes the bodies owed (on the heartbeat); those the store still refuses stay owed."""
        with self._lock:
            owed = list(self._owed.values())
        for body in owed:
            self.db.run(functools.partial(self._save, body=body, conversation=None, if_running=True), write=True)
            with self._lock:
                self._owed.pop(body["id"], None)
            log.warning("response %s, whose end could not be stored when it happened, is stored now as %s",
                        body["id"], body["status"])

    # several instances -------------------------------------------------------------------------
    def progress(self, body: dict[str, Any]) -> None:
        """A queued response began to run: its status for the other instances to see (written over
        "queued" only, so never over an end stored first)."""
        self._run(lambda c: c.execute("UPDATE responses SET status = 'in_progress', updated_at = ?, body = ? WHERE "
                                      "id = ? AND status = 'queued'", (time.time(), _dump(body), body["id"])),
                  write=True)

    def request_cancel(self, response_id: str, owner: str | None) -> str:
        """Asks the instance that runs a response to stop it: "asked"; "cancelled" when that
        instance is dead, or is this one and no longer runs it (marked cancelled here); "ended"
        when it no longer runs; "missing"."""
        def work(conn: Any) -> str:
            row = conn.execute("SELECT owner, status, instance, body FROM responses WHERE id = ?",
                               (response_id,)).fetchone()
            if not row or not _visible(row[0], owner):
                return "missing"
            if row[1] not in ("queued", "in_progress"):
                return "ended"
            mine = row[2] == self.instance_id
            if mine and self.runs(response_id):
                conn.execute("UPDATE responses SET cancel_requested = 1 WHERE id = ?", (response_id,))
                return "asked"
            if not mine and row[2] is not None and conn.execute(
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

    def runs(self, response_id: str) -> bool:
        """Whether this instance runs the response, or still owes the store its end."""
        with self._lock:
            return response_id in self._running or response_id in self._owed

    def sweep(self) -> None:
        """Fails the responses left queued or in progress by dead instances, and this instance's
        own that it no longer runs (the heartbeat's, every SWEEP_EVERY beats)."""
        self.db.run(self._sweep_, write=True)
        self.db.run(self._orphans_, write=True)

    def _beat(self) -> None:
        """The heartbeat: this instance's row renewed; while the store is down, or writes are owed,
        every PROBE_S, so the store is found again (and paid) by itself, with no request needed."""
        beats = 0
        while True:
            self._wake.wait(HEARTBEAT_S if self.health.up and not self._owed else PROBE_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            beats += 1
            try:
                if not self._opened:
                    self.open()
                self.db.run(self._register_, write=True)
                self.health.ok()
                if self._owed:
                    self._pay()
                if beats % SWEEP_EVERY == 0:
                    self.sweep()
                with self._lock:
                    prune, self._writes = self._writes >= PRUNE_EVERY, self._writes % PRUNE_EVERY
                if prune:
                    self.db.run(self._prune_, write=True)
            except RuntimeError:
                return   # closed
            except StoreUnavailable as e:
                self.health.failed(e)
            except Exception as e:  # noqa: BLE001 - the database may come back: the next beat tries again
                log.warning("the store's heartbeat failed (%s); trying again", e)

    # upkeep (store_upkeep.py) -------------------------------------------------------------------
    def _register_(self, conn: Any) -> None:
        upkeep.register(conn, self.db.now, self.instance_id)

    def _sweep_(self, conn: Any) -> None:
        upkeep.sweep(conn, self.db.now, LEASE_S)

    def _orphans_(self, conn: Any) -> None:
        def running() -> set[str]:
            with self._lock:
                return self._running | set(self._owed)
        upkeep.orphans(conn, self.instance_id, running)

    def _retire_(self, conn: Any) -> None:
        upkeep.retire(conn, self.instance_id)

    def _prune_(self, conn: Any) -> None:
        upkeep.prune(conn, self.max_stored, self.max_age_days)
