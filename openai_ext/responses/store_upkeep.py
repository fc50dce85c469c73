"""The store's upkeep, the same SQL on both backends: this instance's heartbeat, the sweep of
responses that dead instances left running, and retention (see store.py)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

RUNNING = "('queued', 'in_progress')"
STOPPED = {"code": "server_error", "message": "The server stopped before this response finished."}
ORPHANED = {"code": "server_error", "message": "The server lost track of this response (its end could not be "
                                              "stored); it did not finish. Send it again."}


def visible(row_owner: str, owner: str | None) -> bool:
    """Whether a row of ``row_owner`` is seen by a caller of ``owner`` (None: everything is shared)."""
    return owner is None or row_owner == owner


def dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def register(conn: Any, now: str, instance: str) -> None:
    """This instance's row, its heartbeat renewed (made again if another swept it away)."""
    conn.execute(f"INSERT INTO instances (id, started_at, heartbeat_at) VALUES (?, {now}, {now}) "
                 f"ON CONFLICT (id) DO UPDATE SET heartbeat_at = {now}", (instance,))


def fail(conn: Any, where: str, params: tuple[Any, ...], *, keep: Callable[[], set[str]] | None = None,
         error: dict[str, str] = STOPPED) -> int:
    """Marks failed the running responses that ``where`` selects, but those of ``keep()`` (asked
    once the rows are read); how many."""
    rows = conn.execute(f"SELECT id, body FROM responses WHERE status IN {RUNNING} AND {where}", params).fetchall()
    if keep is not None:
        kept = keep()
        rows = [(rid, raw) for rid, raw in rows if rid not in kept]
    for rid, raw in rows:
        body = dict(json.loads(raw), status="failed", error=error)
        conn.execute(f"UPDATE responses SET status = 'failed', body = ?, updated_at = ? WHERE id = ? AND "
                     f"status IN {RUNNING}", (dump(body), time.time(), rid))
    return len(rows)


def sweep(conn: Any, now: str, lease_s: float) -> None:
    """Fails the responses that dead instances (silent for ``lease_s``, or gone) left running, and
    forgets the dead instances. A live instance's responses are never touched."""
    live = f"SELECT id FROM instances WHERE heartbeat_at >= {now} - ?"
    n = fail(conn, f"(instance IS NULL OR instance NOT IN ({live}))", (lease_s,))
    conn.execute(f"DELETE FROM instances WHERE heartbeat_at < {now} - ?", (lease_s,))
    if n:
        log.warning("%d stored responses were still running when their server stopped: marked failed", n)


def orphans(conn: Any, instance: str, running: Callable[[], set[str]]) -> None:
    """Fails this instance's rows still queued or in progress that it no longer runs (``running()``,
    asked after the rows are read: a response is claimed before its row is written, and one that
    ended meanwhile is no longer running in its row, which ``fail`` checks again as it writes)."""
    n = fail(conn, "instance = ?", (instance,), keep=running, error=ORPHANED)
    if n:
        log.warning("%d stored responses of this server were left queued or in progress: marked failed", n)


def retire(conn: Any, instance: str) -> None:
    """An instance that closes: the responses it still runs are failed (it will not finish them)."""
    fail(conn, "instance = ?", (instance,))
    conn.execute("DELETE FROM instances WHERE id = ?", (instance,))


def prune(conn: Any, max_stored: int, max_age_days: float) -> None:
    """Applies the retention settings. Responses that still run are never pruned."""
    deleted = 0
    if max_age_days > 0:
        cutoff = time.time() - max_age_days * 86400
        deleted += conn.execute(f"DELETE FROM responses WHERE updated_at < ? AND status NOT IN {RUNNING}",
                                (cutoff,)).rowcount
        old = [r[0] for r in conn.execute("SELECT id FROM conversations WHERE updated_at < ?", (cutoff,))]
        for cid in old:
            conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))
            conn.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (cid,))
    if max_stored > 0:
        deleted += conn.execute(
            f"DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE status NOT IN {RUNNING} "
            f"ORDER BY created_at DESC, id DESC LIMIT {2 ** 62} OFFSET ?)", (max_stored,)).rowcount
    if deleted:
        conn.execute("DELETE FROM items WHERE response_id NOT IN (SELECT id FROM responses)")
        conn.execute("DELETE FROM events WHERE response_id NOT IN (SELECT id FROM responses)")
        log.info("retention: %d stored responses deleted", deleted)
