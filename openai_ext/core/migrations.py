"""A store's schema as one list of named forward steps, for every database it runs on.

``steps[n]`` takes a database from version ``n`` to ``n + 1``: a ``Step`` with its name and what
it is on each database (a script of SQL statements, a function of the connection, or None where
an earlier step there made it already), or a bare script or function, the same everywhere. So a
version number means the same tables on SQLite and on PostgreSQL. The list is only ever appended
to; a released step is never edited, since data folders and databases already ran it. ``pending``
is the one loop over it; each database keeps its version and its lock its own way (SQLite:
``PRAGMA user_version`` here; PostgreSQL: a row, under an advisory lock, in store_postgres.py).

``migrate`` applies the missing ones in order, in one write transaction with the version bump:
a crash leaves the database at its old version, whole, and two processes opening the same file
at once take turns (the second finds the work done). A database written by a newer version of
the code than this one is refused, before anything touches it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Sequence, Union

Migration = Union[str, Callable[[Any], None]]
Database = Literal["sqlite", "postgres"]


@dataclass(frozen=True)
class Step:
    """One change to the tables, by name, as each database writes it (None: nothing to do there)."""
    name: str
    sqlite: Migration | None
    postgres: Migration | None


Steps = Sequence[Union[Step, Migration]]


def pending(steps: Steps, found: int, database: Database) -> Iterator[Migration]:
    """What a database at version ``found`` runs, in order, to reach ``len(steps)``."""
    for step in steps[found:]:
        work = getattr(step, database) if isinstance(step, Step) else step
        if work is not None:
            yield work


class SchemaTooNew(RuntimeError):
    """The database was written by a newer version of the code, whose tables this one does not know."""


def version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def statements(script: str) -> list[str]:
    """A script's statements, one by one (``executescript`` would commit the open transaction)."""
    out, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):   # not a ";" inside a string or a trigger
            if pending.strip(" \t\r\n;"):
                out.append(pending.strip())
            pending = ""
    if pending.strip(" \t\r\n;"):
        raise ValueError(f"an incomplete SQL statement: {pending.strip()!r}")
    return out


def refuse_newer(found: int, known: int, what: str) -> None:
    if found > known:
        raise SchemaTooNew(f"{what} was written by a newer version of this server (schema version {found}; this "
                           f"version knows up to {known}). Run the newer version, or use another data folder "
                           "(or database).")


def migrate(conn: sqlite3.Connection, migrations: Steps, *, what: str = "the database") -> int:
    """Brings the database on ``conn`` (opened with ``isolation_level=None``, outside a
    transaction) up to ``len(migrations)``; returns the version it found."""
    known = len(migrations)
    found = version(conn)
    refuse_newer(found, known, what)
    if found == known:
        return found
    conn.execute("BEGIN IMMEDIATE")   # the write lock first: a second process waits, then reads the new version
    try:
        found = version(conn)
        refuse_newer(found, known, what)
        for step in pending(migrations, found, "sqlite"):
            if callable(step):
                step(conn)
            else:
                for statement in statements(step):
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {known:d}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return found
