"""The store's conversations: their rows and items, the same SQL on both backends (see store.py)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable, TypeVar

from .item_types import Items
from .store_upkeep import dump as _dump
from .store_upkeep import visible as _visible

T = TypeVar("T")


def add_items(conn: Any, cid: str, items: Items) -> None:
    """Appends items to a conversation (in the caller's transaction)."""
    conn.executemany("INSERT INTO conversation_items (conversation_id, item_id, body) VALUES (?, ?, ?)",
                     [(cid, it["id"], _dump(it)) for it in items])


class ConversationRows:
    """Store's conversation methods; ``_run`` is the store's one way to a transaction."""

    def _run(self, work: Callable[[Any], T], *, write: bool = False) -> T:
        raise NotImplementedError

    def put_conversation(self, conv: dict[str, Any], owner: str, items: Items) -> None:
        def work(conn: Any) -> None:
            conn.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                         (conv["id"], owner, conv["created_at"], time.time(), _dump(conv["metadata"])))
            add_items(conn, conv["id"], items)
        self._run(work, write=True)

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

    def add_conversation_items(self, cid: str, owner: str | None, items: Items) -> bool:
        def work(conn: Any) -> bool:
            if self._conversation(conn, cid, owner) is None:
                return False
            conn.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), cid))
            add_items(conn, cid, items)
            return True
        return self._run(work, write=True)

    def conversation_items(self, cid: str, owner: str | None) -> Items | None:
        def work(conn: Any) -> Items | None:
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

