"""Vector stores in the store of responses (the same SQL on SQLite and PostgreSQL): the stores, the
files in them, file batches. Chunks and their vectors are in chunk_rows.py.

- A vector store's status and file_counts are read from its files, never kept beside them, so they
  cannot disagree. ``expired`` comes from ``expires_after`` and the last time it was used.
- Every change a search reads (chunks written or removed, attributes changed) moves the store's
  ``version`` in the same transaction: an instance's in-memory index of that version is current.
- A file's ingestion is claimed by one instance (a conditional update, as batches are), so in a
  shared store each file is embedded once; a file left by an instance that stopped is taken again.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..responses.store import LEASE_S, Store
from ..responses.store_upkeep import dump

STATUSES = ("in_progress", "completed", "failed", "cancelled")
ACTIVE_S = 60.0   # how stale a store's last_active_at may be before a search writes it again
FILE_COLUMNS = "store_id, file_id, created_at, status, batch_id, usage_bytes, body"


def window(c: Any, *, table: str, id_col: str, where: str, args: list[Any], columns: str, order: str,
           after: str | None, before: str | None, limit: int) -> tuple[list[Any], bool] | None:
    """One page of ``table`` by (created_at, id) in ``order``, between the cursors ``after`` and
    ``before``; whether more follow. None: a cursor names a row the caller does not see."""
    desc = order == "desc"
    cond, params = where, list(args)
    for mark_id, forward in ((after, True), (before, False)):
        if mark_id is None:
            continue
        mark = c.execute(f"SELECT created_at, {id_col} FROM {table} WHERE {id_col} = ? AND {where}",
                         (mark_id, *args)).fetchone()
        if mark is None:
            return None
        beyond = "<" if desc == forward else ">"
        cond += f" AND (created_at {beyond} ? OR (created_at = ? AND {id_col} {beyond} ?))"
        params += [mark[0], mark[0], mark[1]]
    # with ``before`` alone the page is the rows nearest it: read backwards, then turned round
    backwards = before is not None and after is None
    direction = "DESC" if desc != backwards else "ASC"
    rows = c.execute(f"SELECT {columns} FROM {table} WHERE {cond} ORDER BY created_at {direction}, "
                     f"{id_col} {direction} LIMIT ?", (*params, limit + 1)).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    if backwards:
        rows.reverse()
    return rows, more


def _counts(rows: list[Any]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for status, n in rows:
        counts[status] = int(n)
    return {**counts, "total": sum(counts.values())}


def _expires_at(row: Any) -> int | None:
    """When a store (its row) expires: ``expires_after`` days after it was last active."""
    expires = json.loads(row[5]).get("expires_after")
    return None if expires is None else int(float(row[3]) + expires["days"] * 86400)


def file_object(row: Any) -> dict[str, Any]:
    body = json.loads(row[6])
    return {"id": row[1], "object": "vector_store.file", "usage_bytes": int(row[5]), "created_at": int(row[2]),
            "vector_store_id": row[0], "status": row[3], "last_error": body.get("last_error"),
            "chunking_strategy": body["chunking_strategy"], "attributes": body.get("attributes") or {}}


class VectorStoreRows:
    def __init__(self, store: Store):
        self.store = store

    # stores ------------------------------------------------------------------------------------
    def put(self, store_id: str, owner: str, now: float, body: dict[str, Any]) -> None:
        self.store.run(lambda c: c.execute(
            "INSERT INTO vector_stores (id, owner, created_at, last_active_at, body) VALUES (?, ?, ?, ?, ?)",
            (store_id, owner, now, now, dump(body))), write=True)

    @staticmethod
    def _row(c: Any, store_id: str, owner: str | None) -> Any:
        row = c.execute("SELECT id, owner, created_at, last_active_at, version, body FROM vector_stores WHERE id = ?",
                        (store_id,)).fetchone()
        return None if row is None or (owner is not None and row[1] != owner) else row

    @staticmethod
    def _object(c: Any, row: Any) -> dict[str, Any]:
        body = json.loads(row[5])
        counts = _counts(c.execute("SELECT status, count(*) FROM vector_store_files WHERE store_id = ? GROUP BY status",
                                   (row[0],)).fetchall())
        usage = c.execute("SELECT coalesce(sum(usage_bytes), 0) FROM vector_store_files WHERE store_id = ?",
                          (row[0],)).fetchone()[0]
        expires, expires_at = body.get("expires_after"), _expires_at(row)
        status = "expired" if expires_at is not None and expires_at <= time.time() else \
            "in_progress" if counts["in_progress"] else "completed"
        out = {"id": row[0], "object": "vector_store", "created_at": int(row[2]), "name": body.get("name") or "",
               "usage_bytes": int(usage), "file_counts": counts, "status": status, "last_active_at": int(row[3]),
               "metadata": body.get("metadata") or {}, "expires_at": expires_at}
        if expires is not None:
            out["expires_after"] = expires
        if body.get("description") is not None:
            out["description"] = body["description"]
        return out

    def get(self, store_id: str, owner: str | None) -> dict[str, Any] | None:
        def work(c: Any) -> dict[str, Any] | None:
            row = self._row(c, store_id, owner)
            return None if row is None else self._object(c, row)
        return self.store.run(work)

    def page(self, owner: str | None, *, order: str, after: str | None, before: str | None,
             limit: int) -> tuple[list[dict[str, Any]], bool] | None:
        where, args = ("owner = ?", [owner]) if owner is not None else ("1 = 1", [])

        def work(c: Any) -> tuple[list[dict[str, Any]], bool] | None:
            found = window(c, table="vector_stores", id_col="id", where=where, args=args, order=order, after=after,
                           before=before, limit=limit, columns="id, owner, created_at, last_active_at, version, body")
            return None if found is None else ([self._object(c, r) for r in found[0]], found[1])
        return self.store.run(work)

    def modify(self, store_id: str, owner: str | None, changes: dict[str, Any]) -> dict[str, Any] | None:
        def work(c: Any) -> dict[str, Any] | None:
            row = self._row(c, store_id, owner)
            if row is None:
                return None
            body = {**json.loads(row[5]), **changes}
            c.execute("UPDATE vector_stores SET body = ? WHERE id = ?", (dump(body), store_id))
            return self._object(c, self._row(c, store_id, None))
        return self.store.run(work, write=True)

    def delete(self, store_id: str, owner: str | None) -> bool:
        def work(c: Any) -> bool:
            if self._row(c, store_id, owner) is None:
                return False
            # (its chunks, any number, are removed after, in pages: chunk_rows.purge)
            for table, col in (("vector_store_files", "store_id"), ("vector_store_file_batches", "store_id"),
                               ("vector_stores", "id")):
                c.execute(f"DELETE FROM {table} WHERE {col} = ?", (store_id,))
            return True
        return self.store.run(work, write=True)

    def touch(self, store_id: str, owner: str | None) -> tuple[bool, int] | None:
        """A search's look at the store: whether it has expired, and its version; ``last_active_at``
        moves to now unless it has expired (an expired store stays expired). The move is written
        only when the time kept is over a minute old: expiry counts in days, and a search then
        takes no write lock (searches at once do not queue for it)."""
        row = self.store.run(lambda c: self._row(c, store_id, owner))
        if row is None:
            return None
        now = time.time()
        expires_at = _expires_at(row)
        expired = expires_at is not None and expires_at <= now
        if not expired and float(row[3]) < now - ACTIVE_S:
            self.store.run(lambda c: c.execute("UPDATE vector_stores SET last_active_at = ? WHERE id = ? AND "
                                               "last_active_at < ?", (now, store_id, now)), write=True)
        return expired, int(row[4])

    # files -------------------------------------------------------------------------------------
    def add_files(self, store_id: str, owner: str | None, entries: list[tuple[str, dict[str, Any]]],
                  batch_id: str | None, now: float) -> list[dict[str, Any]] | None:
        """Adds files (id, body) to be ingested; a file already there is ingested again with the
        new body. Their objects (in_progress); None when the store is not the caller's."""
        def work(c: Any) -> list[dict[str, Any]] | None:
            if self._row(c, store_id, owner) is None:
                return None
            # (a file added again keeps its old chunks until its new ones replace them: chunks of a
            # file that is not completed are read by no search)
            for file_id, body in entries:
                c.execute("DELETE FROM vector_store_files WHERE store_id = ? AND file_id = ?", (store_id, file_id))
                c.execute(f"INSERT INTO vector_store_files ({FILE_COLUMNS}) VALUES (?, ?, ?, 'in_progress', ?, 0, ?)",
                          (store_id, file_id, now, batch_id, dump(body)))
            c.execute("UPDATE vector_stores SET version = version + 1, last_active_at = ? WHERE id = ?",
                      (now, store_id))
            return [file_object((store_id, f, now, "in_progress", batch_id, 0, dump(b))) for f, b in entries]
        return self.store.run(work, write=True)

    def get_file(self, store_id: str, file_id: str, owner: str | None) -> dict[str, Any] | None:
        def work(c: Any) -> dict[str, Any] | None:
            if self._row(c, store_id, owner) is None:
                return None
            row = c.execute(f"SELECT {FILE_COLUMNS} FROM vector_store_files WHERE store_id = ? AND file_id = ?",
                            (store_id, file_id)).fetchone()
            return None if row is None else file_object(row)
        return self.store.run(work)

    def page_files(self, store_id: str, owner: str | None, *, status: str | None, batch_id: str | None, order: str,
                   after: str | None, before: str | None, limit: int) -> tuple[list[dict[str, Any]], bool] | None:
        def work(c: Any) -> tuple[list[dict[str, Any]], bool] | None:
            if self._row(c, store_id, owner) is None:
                return None
            where, args = "store_id = ?", [store_id]
            if status is not None:
                where, args = where + " AND status = ?", [*args, status]
            if batch_id is not None:
                where, args = where + " AND batch_id = ?", [*args, batch_id]
            found = window(c, table="vector_store_files", id_col="file_id", where=where, args=args, order=order,
                           after=after, before=before, limit=limit, columns=FILE_COLUMNS)
            return None if found is None else ([file_object(r) for r in found[0]], found[1])
        return self.store.run(work)

    def update_attributes(self, store_id: str, file_id: str, owner: str | None,
                          attributes: dict[str, Any] | None) -> dict[str, Any] | None:
        def work(c: Any) -> dict[str, Any] | None:
            if self._row(c, store_id, owner) is None:
                return None
            row = c.execute(f"SELECT {FILE_COLUMNS} FROM vector_store_files WHERE store_id = ? AND file_id = ?",
                            (store_id, file_id)).fetchone()
            if row is None:
                return None
            body = {**json.loads(row[6]), "attributes": attributes}
            c.execute("UPDATE vector_store_files SET body = ? WHERE store_id = ? AND file_id = ?",
                      (dump(body), store_id, file_id))
            c.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store_id,))
            return file_object((*row[:6], dump(body)))
        return self.store.run(work, write=True)

    def delete_file(self, store_id: str, file_id: str, owner: str | None) -> bool:
        def work(c: Any) -> bool:
            if self._row(c, store_id, owner) is None:
                return False
            gone = c.execute("DELETE FROM vector_store_files WHERE store_id = ? AND file_id = ?",
                             (store_id, file_id)).rowcount > 0
            c.execute("DELETE FROM vector_chunks WHERE store_id = ? AND file_id = ?", (store_id, file_id))
            c.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store_id,))
            return gone
        return self.store.run(work, write=True)

    def remove_everywhere(self, file_id: str) -> list[str]:
        """Takes a deleted file out of every vector store; the stores it was in."""
        def work(c: Any) -> list[str]:
            stores = [r[0] for r in c.execute("SELECT store_id FROM vector_store_files WHERE file_id = ?",
                                              (file_id,)).fetchall()]
            for store_id in stores:
                c.execute("DELETE FROM vector_chunks WHERE store_id = ? AND file_id = ?", (store_id, file_id))
                c.execute("DELETE FROM vector_store_files WHERE store_id = ? AND file_id = ?", (store_id, file_id))
                c.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store_id,))
            return stores
        return self.store.run(work, write=True)

    # file batches ------------------------------------------------------------------------------
    def put_batch(self, batch_id: str, store_id: str, now: float) -> None:
        self.store.run(lambda c: c.execute("INSERT INTO vector_store_file_batches (id, store_id, created_at) "
                                           "VALUES (?, ?, ?)", (batch_id, store_id, now)), write=True)

    def batch(self, store_id: str, batch_id: str, owner: str | None, *, cancel: bool = False) -> dict[str, Any] | None:
        """The file batch's object; ``cancel``: its files not yet ingested are cancelled first."""
        def work(c: Any) -> dict[str, Any] | None:
            if self._row(c, store_id, owner) is None:
                return None
            row = c.execute("SELECT created_at, cancelled FROM vector_store_file_batches WHERE id = ? AND "
                            "store_id = ?", (batch_id, store_id)).fetchone()
            if row is None:
                return None
            cancelled = bool(row[1])
            waiting = c.execute("SELECT count(*) FROM vector_store_files WHERE batch_id = ? AND status = "
                                "'in_progress'", (batch_id,)).fetchone()[0]
            if cancel and not cancelled and waiting:   # (a batch that has ended stays as it ended)
                c.execute("UPDATE vector_store_file_batches SET cancelled = 1 WHERE id = ?", (batch_id,))
                c.execute("UPDATE vector_store_files SET status = 'cancelled', instance = NULL WHERE batch_id = ? "
                          "AND status = 'in_progress'", (batch_id,))
                cancelled = True
            counts = _counts(c.execute("SELECT status, count(*) FROM vector_store_files WHERE batch_id = ? "
                                       "GROUP BY status", (batch_id,)).fetchall())
            status = "cancelled" if cancelled else "in_progress" if counts["in_progress"] else \
                "failed" if counts["total"] and counts["failed"] == counts["total"] else "completed"
            return {"id": batch_id, "object": "vector_store.files_batch", "created_at": int(row[0]),
                    "vector_store_id": store_id, "status": status, "file_counts": counts}
        return self.store.run(work, write=cancel)

    # ingestion ---------------------------------------------------------------------------------
    def claim(self, instance: str) -> tuple[str, str, dict[str, Any]] | None:
        """Takes the oldest file waiting to be ingested that no live instance has: (store, file, body)."""
        now = self.store.db.now
        free = (f"status = 'in_progress' AND (instance IS NULL OR instance = ? OR instance NOT IN "
                f"(SELECT id FROM instances WHERE heartbeat_at >= {now} - ?))")

        def look(c: Any) -> Any:
            return c.execute(f"SELECT store_id, file_id, body FROM vector_store_files WHERE {free} "
                             "ORDER BY created_at LIMIT 1", (instance, LEASE_S)).fetchone()

        if self.store.run(look) is None:   # (an idle instance's look every few seconds takes no write lock)
            return None

        def work(c: Any) -> tuple[str, str, dict[str, Any]] | None:
            row = look(c)
            if row is None:
                return None
            taken = c.execute(f"UPDATE vector_store_files SET instance = ? WHERE store_id = ? AND file_id = ? AND "
                              f"{free}", (instance, row[0], row[1], instance, LEASE_S)).rowcount
            return (row[0], row[1], json.loads(row[2])) if taken == 1 else None
        return self.store.run(work, write=True)

    def fail(self, store_id: str, file_id: str, instance: str, code: str, message: str) -> None:
        def work(c: Any) -> None:
            row = c.execute("SELECT body FROM vector_store_files WHERE store_id = ? AND file_id = ? AND instance = ? "
                            "AND status = 'in_progress'", (store_id, file_id, instance)).fetchone()
            if row is not None:
                body = {**json.loads(row[0]), "last_error": {"code": code, "message": message}}
                c.execute("UPDATE vector_store_files SET status = 'failed', instance = NULL, body = ? "
                          "WHERE store_id = ? AND file_id = ?", (dump(body), store_id, file_id))
                c.execute("DELETE FROM vector_chunks WHERE store_id = ? AND file_id = ?", (store_id, file_id))
        self.store.run(work, write=True)
