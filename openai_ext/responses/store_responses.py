"""The store's responses: their rows, input and output items, and background events, the same
SQL on both backends (see store.py)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable, TypeVar

from .item_types import Item, Items
from .render import conform, conform_event
from .store_conversations import add_items
from .store_upkeep import RUNNING
from .store_upkeep import dump as _dump
from .store_upkeep import visible as _visible

T = TypeVar("T")


class ResponseRows:
    """Store's response methods; ``_run`` is the store's one way to a transaction."""

    instance_id: str

    def _run(self, work: Callable[[Any], T], *, write: bool = False) -> T:
        raise NotImplementedError

    def put_response(self, body: dict[str, Any], owner: str, input_items: Items) -> None:
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
    def _put_items(conn: Any, response_id: str, role: str, items: Iterable[Item]) -> None:
        conn.executemany("INSERT INTO items (response_id, item_id, role, body) VALUES (?, ?, ?, ?)",
                         [(response_id, it["id"], role, _dump(it)) for it in items])

    def save_response(self, body: dict[str, Any], *, conversation: tuple[str, Items] | None = None,
                      output: Items | None = None) -> None:
        """The response as it ended: its body, its output items (``output``: as a chain shows them
        to the model, where they hold more than the body shows the client), and the turn appended
        to its conversation."""
        self._run(lambda conn: self._save(conn, body, conversation, output=output), write=True)

    def _save(self, conn: Any, body: dict[str, Any], conversation: tuple[str, Items] | None, *,
              if_running: bool = False, output: Items | None = None) -> None:
        now = time.time()
        only = f" AND status IN {RUNNING}" if if_running else ""
        found = conn.execute(f"UPDATE responses SET status = ?, updated_at = ?, body = ? WHERE id = ?{only}",
                             (body["status"], now, _dump(body), body["id"])).rowcount
        if not found:
            return   # deleted while it ran (or, if_running, ended by a cancel meanwhile)
        conn.execute("DELETE FROM items WHERE response_id = ? AND role = 'output'", (body["id"],))
        self._put_items(conn, body["id"], "output", body["output"] if output is None else output)
        if conversation is not None:
            cid, turn_items = conversation
            if conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, cid)).rowcount:
                add_items(conn, cid, turn_items)

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
        return conform(json.loads(row[1])) if row and _visible(row[0], owner) else None

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

    def input_items(self, response_id: str, owner: str | None) -> Items | None:
        def work(conn: Any) -> Items | None:
            row = conn.execute("SELECT owner FROM responses WHERE id = ?", (response_id,)).fetchone()
            if not row or not _visible(row[0], owner):
                return None
            rows = conn.execute("SELECT body FROM items WHERE response_id = ? AND role = 'input' ORDER BY seq",
                                (response_id,)).fetchall()
            return [json.loads(r[0]) for r in rows]
        return self._run(work)

    def history(self, response_id: str, owner: str | None) -> Items:
        """Every item a continuation of ``response_id`` sees: the input and output items of it and
        of the responses it continued from, oldest first. A deleted link ends the chain."""
        def work(conn: Any) -> Items:
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

    @staticmethod
    def _item(conn: Any, item_id: str, owner: str | None) -> Item | None:
        rows = conn.execute("SELECT r.owner, i.body FROM items i JOIN responses r ON r.id = i.response_id "
                            "WHERE i.item_id = ? ORDER BY i.seq DESC", (item_id,)).fetchall()
        rows += conn.execute("SELECT c.owner, i.body FROM conversation_items i JOIN conversations c "
                             "ON c.id = i.conversation_id WHERE i.item_id = ? ORDER BY i.seq DESC",
                             (item_id,)).fetchall()
        return next((json.loads(body) for row_owner, body in rows if _visible(row_owner, owner)), None)

    def item(self, item_id: str, owner: str | None) -> Item | None:
        """A stored item by id (for item_reference): the newest one the caller may see."""
        return self._run(lambda conn: self._item(conn, item_id, owner))

    def items(self, item_ids: list[str], owner: str | None) -> dict[str, Item]:
        """The stored items of these ids that the caller may see (as ``item``), in one call."""
        def work(conn: Any) -> dict[str, Item]:
            found = {i: self._item(conn, i, owner) for i in dict.fromkeys(item_ids)}
            return {i: it for i, it in found.items() if it is not None}
        return self._run(work)

    def events(self, response_id: str) -> list[dict[str, Any]]:
        rows = self._run(lambda c: c.execute("SELECT body FROM events WHERE response_id = ? ORDER BY seq",
                                             (response_id,)).fetchall())
        return [conform_event(json.loads(r[0])) for r in rows]

