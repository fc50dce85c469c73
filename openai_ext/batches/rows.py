"""Batches in the store of responses (the same SQL on SQLite and PostgreSQL): the Batch object as a
JSON document with the columns queries need, which instance runs it, and each line's result."""

from __future__ import annotations

import json
from typing import Any

from ..responses.store import LEASE_S, Store
from ..responses.store_upkeep import dump

# A batch that still has work: it is run by one instance, or waits to be taken.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
_ACTIVE_SQL = "(" + ", ".join(f"'{s}'" for s in ACTIVE) + ")"


class BatchRows:
    def __init__(self, store: Store):
        self.store = store

    def put(self, body: dict[str, Any], owner: str) -> None:
        self.store.run(lambda c: c.execute(
            "INSERT INTO batches (id, owner, created_at, status, body) VALUES (?, ?, ?, ?, ?)",
            (body["id"], owner, body["created_at"], body["status"], dump(body))), write=True)

    @staticmethod
    def _counted(c: Any, body: dict[str, Any]) -> dict[str, Any]:
        """The Batch object with its live request counts (from the lines done so far); the
        server's own notes in the document (keys from "_") are not shown."""
        body = {k: v for k, v in body.items() if not k.startswith("_")}
        done = c.execute("SELECT ok, count(*) FROM batch_lines WHERE batch_id = ? GROUP BY ok",
                         (body["id"],)).fetchall()
        counts = {bool(ok): int(n) for ok, n in done}
        body["request_counts"] = {"total": body.get("request_counts", {}).get("total", 0),
                                  "completed": counts.get(True, 0), "failed": counts.get(False, 0)}
        return body

    @staticmethod
    def _raw(c: Any, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        """The stored document, the server's own notes included."""
        row = c.execute("SELECT owner, body FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None or (owner is not None and row[0] != owner):
            return None
        return dict(json.loads(row[1]))

    def _get(self, c: Any, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        body = self._raw(c, batch_id, owner)
        return None if body is None else self._counted(c, body)

    def get(self, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        return self.store.run(lambda c: self._get(c, batch_id, owner))

    def output_expiry(self, batch_id: str) -> int | None:
        """Seconds the batch's output and error files live (output_expires_after), or None."""
        row = self.store.run(lambda c: c.execute("SELECT body FROM batches WHERE id = ?", (batch_id,)).fetchone())
        return json.loads(row[0]).get("_output_expires_after")

    def owner(self, batch_id: str) -> str:
        return self.store.run(lambda c: c.execute("SELECT owner FROM batches WHERE id = ?", (batch_id,)).fetchone()[0])

    def page(self, owner: str | None, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool] | None:
        """Newest first, after the batch ``after`` (None when the caller cannot see it)."""
        def work(c: Any) -> tuple[list[dict[str, Any]], bool] | None:
            where, args = ("owner = ?", [owner]) if owner is not None else ("1 = 1", [])
            if after is not None:
                mark = c.execute(f"SELECT created_at, id FROM batches WHERE id = ? AND {where}",
                                 (after, *args)).fetchone()
                if mark is None:
                    return None
                where += " AND (created_at < ? OR (created_at = ? AND id < ?))"
                args += [mark[0], mark[0], mark[1]]
            rows = c.execute(f"SELECT body FROM batches WHERE {where} ORDER BY created_at DESC, id DESC LIMIT ?",
                             (*args, limit + 1)).fetchall()
            return [self._counted(c, json.loads(r[0])) for r in rows[:limit]], len(rows) > limit
        return self.store.run(work)

    def update(self, batch_id: str, **changes: Any) -> dict[str, Any]:
        """Sets fields of the Batch object (its status column follows ``status``); the new body."""
        def work(c: Any) -> dict[str, Any]:
            body = json.loads(c.execute("SELECT body FROM batches WHERE id = ?", (batch_id,)).fetchone()[0])
            body.update(changes)
            c.execute("UPDATE batches SET status = ?, body = ? WHERE id = ?", (body["status"], dump(body), batch_id))
            return self._counted(c, body)
        return self.store.run(work, write=True)

    def cancel(self, batch_id: str, owner: str | None, now: int) -> dict[str, Any] | None:
        """Asks the batch to stop: cancelling (the instance that runs it ends it within a step)."""
        def work(c: Any) -> dict[str, Any] | None:
            body = self._raw(c, batch_id, owner)
            if body is None or body["status"] not in ("validating", "in_progress"):
                return None if body is None else self._counted(c, body)
            body.update(status="cancelling", cancelling_at=now)
            c.execute("UPDATE batches SET status = ?, body = ?, cancel_requested = 1 WHERE id = ?",
                      ("cancelling", dump(body), batch_id))
            return self._counted(c, body)
        return self.store.run(work, write=True)

    def cancel_requested(self, batch_id: str) -> bool:
        return bool(self.store.run(lambda c: c.execute("SELECT cancel_requested FROM batches WHERE id = ?",
                                                       (batch_id,)).fetchone()[0]))

    def claim(self, instance: str) -> str | None:
        """Takes the oldest batch with work that no live instance runs (its own from before a
        restart included): exactly one instance gets it, whatever number ask at once."""
        now = self.store.db.now
        free = (f"status IN {_ACTIVE_SQL} AND (instance IS NULL OR instance = ? OR instance NOT IN "
                f"(SELECT id FROM instances WHERE heartbeat_at >= {now} - ?))")

        def look(c: Any) -> Any:
            return c.execute(f"SELECT id FROM batches WHERE {free} ORDER BY created_at LIMIT 1",
                             (instance, LEASE_S)).fetchone()

        if self.store.run(look) is None:   # (an idle instance's look every few seconds takes no write lock)
            return None

        def work(c: Any) -> str | None:
            row = look(c)
            if row is None:
                return None
            taken = c.execute(f"UPDATE batches SET instance = ? WHERE id = ? AND {free}",
                              (instance, row[0], instance, LEASE_S)).rowcount
            return row[0] if taken == 1 else None
        return self.store.run(work, write=True)

    def release(self, batch_id: str) -> None:
        self.store.run(lambda c: c.execute("UPDATE batches SET instance = NULL WHERE id = ?", (batch_id,)), write=True)

    def done(self, batch_id: str) -> set[int]:
        rows = self.store.run(lambda c: c.execute("SELECT line FROM batch_lines WHERE batch_id = ?",
                                                  (batch_id,)).fetchall())
        return {int(r[0]) for r in rows}

    def add_line(self, batch_id: str, line: int, ok: bool, body: dict[str, Any]) -> None:
        # (a line another instance stored first, after a lease it let lapse, is kept as it was)
        self.store.run(lambda c: c.execute("INSERT INTO batch_lines (batch_id, line, ok, body) VALUES (?, ?, ?, ?) "
                                           "ON CONFLICT (batch_id, line) DO NOTHING",
                                           (batch_id, line, int(ok), dump(body))), write=True)

    def results(self, batch_id: str) -> list[tuple[bool, dict[str, Any]]]:
        rows = self.store.run(lambda c: c.execute("SELECT ok, body FROM batch_lines WHERE batch_id = ? ORDER BY line",
                                                  (batch_id,)).fetchall())
        return [(bool(r[0]), json.loads(r[1])) for r in rows]
