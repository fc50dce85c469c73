"""The store's SQLite backend (the default): one file in the data folder, the standard library's
driver.

- One connection, opened on first use (a server that never stores anything creates no file),
  shared by every thread under a lock; WAL journaling, so another process (a second server on the
  same folder) reads while this one writes, and ``busy_timeout`` makes writers wait for each other
  instead of failing. Every call is one transaction: a crash leaves each object whole or absent.
- Every call has one deadline (``timeout``: the database_timeout setting) for the lock, SQLite's
  own locks and the statements: past it the watchdog interrupts the statement (a disk that
  stalls, another process that holds the file), and the call is ``StoreUnavailable``.
- The schema version is ``PRAGMA user_version`` (core/migrations.py).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..core.migrations import migrate
from ..core.watchdog import WATCHDOG
from .store_health import StoreUnavailable
from .store_schema import STEPS

log = logging.getLogger(__name__)

T = TypeVar("T")
FILE = "responses.sqlite3"



def _transaction(conn: sqlite3.Connection, work: Callable[[Any], T], *, write: bool) -> T:
    # IMMEDIATE takes the write lock at once: two writers wait for each other (busy_timeout)
    # instead of one failing halfway when the other commits first.
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        out = work(conn)
    except BaseException:
        if conn.in_transaction:   # an interrupted statement has rolled its transaction back already
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return out


def _retrying(run: Callable[[], T], deadline: float | None = None, attempts: int = 5) -> T:
    """``run()``, again when SQLite answers "locked" at once. busy_timeout makes a writer wait for
    another, but a few of WAL mode's locks (another connection opening the database or
    checkpointing it) are refused without waiting; the transaction was rolled back, so it is
    simply run again, while time is left before ``deadline``."""
    for attempt in range(attempts):
        try:
            return run()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or attempt == attempts - 1:
                raise
            if deadline is not None and time.monotonic() + 0.01 * 2 ** attempt >= deadline:
                raise
            time.sleep(0.01 * 2 ** attempt)
    raise AssertionError("unreachable")


class SqliteDatabase:
    """The connection to the file, and its transactions (see ``Database`` in store.py)."""

    # the database's clock, in seconds since 1970 (heartbeats are compared on one clock)
    now = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, folder: Path | str, *, timeout: float = 5.0):
        self.folder = Path(folder).expanduser()
        self.timeout = timeout
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    @property
    def path(self) -> Path:
        return self.folder / FILE

    @property
    def what(self) -> str:
        return str(self.path)

    def open(self) -> None:
        """Connects (and migrates), within the deadline as any call."""
        self.run(lambda conn: None)

    def _connect(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError("the store is closed")
        if self._conn is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=self.timeout)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")   # WAL: durable at checkpoints, never corrupt
                conn.execute(f"PRAGMA busy_timeout={max(1, int(self.timeout * 1000)):d}")
                _retrying(lambda: migrate(conn, STEPS, what=str(self.path)), time.monotonic() + self.timeout)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def run(self, work: Callable[[Any], T], *, write: bool = False) -> T:
        """``work(conn)`` in one transaction, under the lock, within ``timeout`` seconds in all."""
        deadline = time.monotonic() + self.timeout
        if not self._lock.acquire(timeout=self.timeout):
            raise self._late()
        try:
            try:
                conn = _retrying(self._connect, deadline)
                # SQLite's own wait for another connection's lock ends by the deadline too
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._late()
                conn.execute(f"PRAGMA busy_timeout={max(1, int(left * 1000)):d}")
            except sqlite3.OperationalError as e:
                raise self._broken(e) from None
            armed = WATCHDOG.arm(deadline, conn.interrupt)
            try:
                return _retrying(lambda: _transaction(conn, work, write=write), deadline)
            except sqlite3.OperationalError as e:
                if not armed.disarm():
                    raise self._late() from None
                raise self._broken(e) from None
            finally:
                armed.disarm()
        finally:
            self._lock.release()

    def _broken(self, e: sqlite3.Error) -> StoreUnavailable:
        return StoreUnavailable(f"The database of stored responses ({self.path}) cannot be used: {e}. Check the disk, "
                                "the folder's permissions (data_dir) and that no other program holds the file; "
                                f"each call waits database_timeout ({self.timeout:g} s) at most.")

    def _late(self) -> StoreUnavailable:
        return StoreUnavailable(f"The database of stored responses ({self.path}) did not answer within "
                                f"{self.timeout:g} s (database_timeout): another program may hold it, or its disk "
                                "stalls; retrying may help.")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
