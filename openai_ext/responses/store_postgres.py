"""The store's PostgreSQL backend (``database_url``), for several servers sharing one store.

- A small pool of connections (psycopg 3, autocommit, a transaction per call), opened as needed
  up to ``POOL_SIZE``.
- Every call has one deadline (``timeout``: the database_timeout setting), enforced here, not by
  the database: waiting for a pooled connection, connecting, and the statements all fit in it.
  Past it, the watchdog (core/watchdog.py) shuts the connection's socket down, which ends the call
  even when the database's process is frozen and its kernel still acknowledges every packet; the
  connection is dropped. ``statement_timeout`` is set to the same, so a live database stops the
  work too, and TCP keepalives notice a server that vanished. A database that cannot be reached,
  or not in time, is ``StoreUnavailable`` (503, in the API's error shape, naming the store); a
  pooled connection the server dropped (a restart) is replaced and the call run once more.
- The schema version is one row in ``openai_ext_schema``; migrations run under an advisory lock,
  so servers starting at once take turns and the later ones find the work done.
- The URL is logged and reported with its password masked (``masked``).
"""

from __future__ import annotations

import functools
import math
import os
import re
import socket
import threading
import time
from typing import Any, Callable, TypeVar
from urllib.parse import urlsplit

from ..core.migrations import Steps, pending, refuse_newer
from ..core.watchdog import WATCHDOG
from .store_health import StoreUnavailable
from .store_schema import STEPS

T = TypeVar("T")

POOL_SIZE = 8
MIGRATE_S = 60.0   # the deadline of the schema's migration at start (servers starting at once take turns)
VERSION_TABLE = "openai_ext_schema"
LOCK_KEY = 0x6F61695F657874   # pg_advisory_xact_lock's key for migrations ("oai_ext")



def masked(url: str) -> str:
    """The URL with its password replaced by ***, fit for a log line or an error message."""
    out = url
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        out = out.replace(f":{password}@", ":***@", 1)
    return re.sub(r"(password=)[^&\s]*", r"\1***", out)


def _driver() -> Any:
    try:
        import psycopg
    except ImportError:
        raise RuntimeError("database_url needs the psycopg package: pip install 'psycopg[binary]' "
                           "(or this project's 'postgres' extra)") from None
    return psycopg


def migrate(conn: Any, migrations: Steps, *, what: str) -> int:
    """Brings the database up to ``len(migrations)`` in one transaction, under an advisory lock;
    returns the version it found. A newer database is refused (SchemaTooNew), untouched."""
    known = len(migrations)
    with conn.transaction():
        # servers starting at once wait here for each other: longer than a request's deadline
        conn.execute(f"SET LOCAL statement_timeout = {int(MIGRATE_S * 1000):d}")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        conn.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL)")
        row = conn.execute(f"SELECT version FROM {VERSION_TABLE}").fetchone()
        found = int(row[0]) if row else 0
        refuse_newer(found, known, what)
        for step in pending(migrations, found, "postgres"):
            if callable(step):
                step(conn)
            else:
                conn.execute(step)
        if row is None:
            conn.execute(f"INSERT INTO {VERSION_TABLE} VALUES (%s)", (known,))
        elif found != known:
            conn.execute(f"UPDATE {VERSION_TABLE} SET version = %s", (known,))
    return found


class _Tx:
    """A connection as the store's shared SQL uses it: ``?`` placeholders, as in sqlite3."""

    def __init__(self, conn: Any):
        self.conn = conn

    def execute(self, sql: str, params: Any = ()) -> Any:
        return self.conn.execute(sql.replace("?", "%s"), tuple(params) or None)

    def executemany(self, sql: str, rows: list[Any]) -> None:
        if rows:
            with self.conn.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), rows)


class PostgresDatabase:
    """The pool of connections and their transactions (see ``Database`` in store.py)."""

    now = "extract(epoch from clock_timestamp())"

    def __init__(self, url: str, *, timeout: float = 5.0):
        self.url = url
        self.what = masked(url)
        self.timeout = timeout
        self._idle: list[Any] = []
        self._slots = threading.BoundedSemaphore(POOL_SIZE)
        self._lock = threading.Lock()
        self._migrated = False
        self._closed = False

    def unavailable(self, e: BaseException | str) -> StoreUnavailable:
        text = e if isinstance(e, str) else str(e).strip()
        detail = text.splitlines()[0] if text else type(e).__name__
        try:
            password = urlsplit(self.url).password
        except ValueError:
            password = None
        if password:
            detail = detail.replace(password, "***")
        return StoreUnavailable(f"The database of stored responses ({self.what}) cannot be used: {detail}. Check that "
                                f"it is running, that database_url points to it, and that database_timeout "
                                f"({self.timeout:g} s) gives it time enough; retrying may help.")

    def _connect(self, deadline: float) -> Any:
        psycopg = _driver()
        left = deadline - time.monotonic()
        if left <= 0:
            raise self.unavailable(f"no answer within {self.timeout:g} s")
        try:
            # libpq counts whole seconds, 2 at least; the watchdog keeps the exact deadline after
            return psycopg.connect(self.url, autocommit=True, connect_timeout=max(2, math.ceil(left)), keepalives=1,
                                   keepalives_idle=10, keepalives_interval=3, keepalives_count=3)
        except psycopg.Error as e:
            raise self.unavailable(e) from None

    def _take(self, deadline: float) -> tuple[Any, bool]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the store is closed")
            if self._idle:
                return self._idle.pop(), False
        return self._connect(deadline), True

    def _give(self, conn: Any) -> None:
        with self._lock:
            if not self._closed and not conn.closed and not conn.broken:
                self._idle.append(conn)
                return
        conn.close()

    def open(self) -> None:
        """Connects and brings the schema up to date (once)."""
        if self._migrated:
            return
        self.run(lambda tx: None)   # a clear StoreUnavailable first when the server cannot be reached
        self.run(lambda tx: migrate(tx.conn, STEPS, what=f"The database {self.what}"), raw=True,
                 timeout=max(self.timeout, MIGRATE_S))
        self._migrated = True

    def run(self, work: Callable[[Any], T], *, write: bool = False, raw: bool = False,
            timeout: float | None = None) -> T:
        """``work(tx)`` in one transaction on a pooled connection, within ``timeout`` seconds in all
        (default: the store's). ``raw``: ``work`` makes its own transactions."""
        psycopg = _driver()
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if not self._slots.acquire(timeout=timeout):
            raise self.unavailable(f"every connection stayed busy for {self.timeout:g} s")
        try:
            for attempt in range(2):
                conn, fresh = self._take(deadline)
                armed = WATCHDOG.arm(deadline, functools.partial(_shut, conn))
                try:
                    if fresh:
                        conn.execute(f"SET statement_timeout = {max(1, int(self.timeout * 1000)):d}")
                    if raw:
                        out = work(_Tx(conn))
                    else:
                        with conn.transaction():
                            out = work(_Tx(conn))
                except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                    in_time = armed.disarm()
                    if not in_time:
                        conn.close()
                        raise self.unavailable(f"no answer within {self.timeout:g} s") from None
                    broken = conn.closed or conn.broken
                    self._give(conn)
                    if broken and not fresh and attempt == 0:
                        continue   # a pooled connection the server dropped: once more, on a new one
                    raise self.unavailable(e) from None
                except BaseException:
                    if not armed.disarm():
                        conn.close()
                        raise
                    self._give(conn)
                    raise
                if not armed.disarm():   # it ended just as its deadline came: the socket may be shut
                    conn.close()
                    return out
                self._give(conn)
                return out
            raise AssertionError("unreachable")
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _shut(conn: Any) -> None:
    """Breaks a call that is waiting on ``conn``: its socket is shut down (on a copy of the
    descriptor, so the connection's own is closed by its owner), and the call ends with an error."""
    fd = conn.pgconn.socket
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)
