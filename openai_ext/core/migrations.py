"""A SQLite database's schema as a list of forward migrations.

The schema version is the database's ``PRAGMA user_version`` (0 in a new file, and in one
written before versions existed). ``migrations[n]`` takes a database from version ``n`` to
``n + 1``: a script of SQL statements or a function of the connection. The list is only ever
appended to; a released migration is never edited, since data folders already ran it.

``migrate`` applies the missing ones in order, in one write transaction with the version bump:
a crash leaves the database at its old version, whole, and two processes opening the same file
at once take turns (the second finds the work done). A database written by a newer version of
the code than this one is refused, before anything touches it.
"""

from __future__ import annotations

import sqlite3
from typing import Callable, Sequence, Union

Migration = Union[str, Callable[[sqlite3.Connection], None]]


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


def migrate(conn: sqlite3.Connection, migrations: Sequence[Migration], *, what: str = "the database") -> int:
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
        for step in migrations[found:]:
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
