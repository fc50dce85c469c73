"""The files' records in the store (the same SQL on SQLite and PostgreSQL, responses/store.py):
one row per file, what the File object says of it. The contents are not here (service.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..responses.store import Store

COLUMNS = "id, owner, created_at, expires_at, bytes, filename, purpose"


@dataclass(frozen=True)
class FileRow:
    id: str
    owner: str
    created_at: float
    expires_at: float | None
    bytes: int
    filename: str
    purpose: str

    def body(self) -> dict[str, Any]:
        """The File object. ``status`` is deprecated but required: a stored file is processed."""
        out: dict[str, Any] = {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": int(self.created_at),
                               "filename": self.filename, "purpose": self.purpose, "status": "processed"}
        if self.expires_at is not None:
            out["expires_at"] = int(self.expires_at)
        return out


def _live(owner: str | None) -> tuple[str, list[Any]]:
    """The WHERE clause of the files a caller sees: its own (None: all), not expired."""
    where, params = "(expires_at IS NULL OR expires_at > ?)", list[Any]([time.time()])
    if owner is not None:
        where += " AND owner = ?"
        params.append(owner)
    return where, params


def _row(r: Any) -> FileRow:
    return FileRow(r[0], r[1], float(r[2]), None if r[3] is None else float(r[3]), int(r[4]), r[5], r[6])


class FileRows:
    def __init__(self, store: Store):
        self.store = store

    def put(self, row: FileRow) -> None:
        self.store.run(lambda c: c.execute(f"INSERT INTO files ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                           (row.id, row.owner, row.created_at, row.expires_at, row.bytes,
                                            row.filename, row.purpose)), write=True)

    def get(self, file_id: str, owner: str | None) -> FileRow | None:
        where, params = _live(owner)
        found = self.store.run(lambda c: c.execute(f"SELECT {COLUMNS} FROM files WHERE id = ? AND {where}",
                                                   (file_id, *params)).fetchone())
        return _row(found) if found else None

    def page(self, owner: str | None, *, purpose: str | None, after: str | None, limit: int,
             order: str) -> tuple[list[FileRow], bool] | None:
        """Up to ``limit`` files in ``order`` of creation, after the file ``after`` (None when that
        file is not one the caller sees); whether more follow."""
        where, params = _live(owner)
        if purpose is not None:
            where += " AND purpose = ?"
            params.append(purpose)
        direction, beyond = ("DESC", "<") if order == "desc" else ("ASC", ">")

        def work(c: Any) -> tuple[list[FileRow], bool] | None:
            cond, args = where, list(params)
            if after is not None:
                mark = c.execute(f"SELECT created_at, id FROM files WHERE id = ? AND {where}",
                                 (after, *params)).fetchone()
                if mark is None:
                    return None
                cond += f" AND (created_at {beyond} ? OR (created_at = ? AND id {beyond} ?))"
                args += [mark[0], mark[0], mark[1]]
            rows = c.execute(f"SELECT {COLUMNS} FROM files WHERE {cond} ORDER BY created_at {direction}, "
                             f"id {direction} LIMIT ?", (*args, limit + 1)).fetchall()
            return [_row(r) for r in rows[:limit]], len(rows) > limit
        return self.store.run(work)

    def delete(self, file_id: str, owner: str | None) -> bool:
        where, params = _live(owner)
        return self.store.run(lambda c: c.execute(f"DELETE FROM files WHERE id = ? AND {where}",
                                                  (file_id, *params)).rowcount > 0, write=True)

    def take_expired(self, most: int) -> list[str]:
        """Deletes up to ``most`` expired files' records; their ids (whose contents go next)."""
        def work(c: Any) -> list[str]:
            ids = [r[0] for r in c.execute("SELECT id FROM files WHERE expires_at <= ? LIMIT ?",
                                           (time.time(), most)).fetchall()]
            for file_id in ids:
                c.execute("DELETE FROM files WHERE id = ?", (file_id,))
            return ids
        return self.store.run(work, write=True)
