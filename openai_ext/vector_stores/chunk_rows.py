"""Chunks in the store of responses: each chunk's text and its vector (float32 bytes), written with
its file's completion in one transaction, read back whole to build an index (index.py) and by
key for a search's results."""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..responses.store import Store

log = logging.getLogger(__name__)

PAGE = 10000   # chunks read in one transaction


@dataclass(frozen=True)
class Matrix:
    """A store's chunks as an index reads them: row i is chunk ``seqs[i]`` of file ``files[owners[i]]``."""
    vectors: np.ndarray                  # (n, d) float32, unit length
    owners: np.ndarray                   # (n,) index into files
    seqs: np.ndarray                     # (n,) the chunk's number in its file
    files: list[str]
    filenames: list[str]
    attributes: list[dict[str, Any]]
    masks: dict[str, np.ndarray] = field(default_factory=dict, compare=False)   # filter -> files it lets through
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False)   # (searches run on threads)


class ChunkRows:
    def __init__(self, store: Store):
        self.store = store

    def finish(self, store_id: str, file_id: str, instance: str, texts: list[str], vectors: np.ndarray) -> bool:
        """Stores the file's chunks and marks it completed, if this instance still has it (it was
        not cancelled, removed or added again meanwhile); whether it did."""
        usage = sum(len(t.encode()) for t in texts) + int(vectors.nbytes)
        rows = [(store_id, file_id, i, text, np.ascontiguousarray(vectors[i], dtype=np.float32).tobytes())
                for i, text in enumerate(texts)]

        def work(c: Any) -> bool:
            mine = c.execute("UPDATE vector_store_files SET status = 'completed', instance = NULL, usage_bytes = ? "
                             "WHERE store_id = ? AND file_id = ? AND instance = ? AND status = 'in_progress'",
                             (usage, store_id, file_id, instance)).rowcount == 1
            if mine:
                c.execute("DELETE FROM vector_chunks WHERE store_id = ? AND file_id = ?", (store_id, file_id))
                c.executemany("INSERT INTO vector_chunks (store_id, file_id, seq, text, vector) VALUES (?, ?, ?, ?, ?)",
                              rows)
                c.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store_id,))
            return mine
        return self.store.run(work, write=True)

    def purge(self, store_id: str) -> None:
        """Removes a deleted store's chunks, a page at a time (each page a short transaction)."""
        while self.store.run(lambda c: c.execute(
                "DELETE FROM vector_chunks WHERE (store_id, file_id, seq) IN (SELECT store_id, file_id, seq FROM "
                "vector_chunks WHERE store_id = ? LIMIT ?)", (store_id, PAGE)).rowcount, write=True):
            pass

    def matrix(self, store_id: str) -> tuple[Matrix, int]:
        """Every chunk of the store's completed files, and the version they are of. Read in pages,
        each a short transaction of its own (a large store never holds the store's connection, nor
        runs into its deadline), and built into a matrix outside them; read again if the store
        changed meanwhile (a store that never stops changing: the last read, labelled with the
        version it began at, so the next search reads it again)."""
        for _ in range(3):
            version, files = self.store.run(lambda c: _files(c, store_id))
            rows: list[Any] = []
            after: tuple[str, int] = ("", -1)
            while True:
                page = self.store.run(functools.partial(_page, store_id=store_id, after=after))
                rows += page
                if len(page) < PAGE:
                    break
                after = (page[-1][0], int(page[-1][1]))
            if self.store.run(lambda c: _files(c, store_id))[0] == version:
                break
        return _matrix(files, rows), version

    def texts(self, store_id: str, keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        def work(c: Any) -> dict[tuple[str, int], str]:
            out = {}
            for file_id, seq in keys:
                row = c.execute("SELECT text FROM vector_chunks WHERE store_id = ? AND file_id = ? AND seq = ?",
                                (store_id, file_id, seq)).fetchone()
                if row is not None:
                    out[(file_id, seq)] = row[0]
            return out
        return self.store.run(work)

    def file_texts(self, store_id: str, file_id: str) -> list[str]:
        rows = self.store.run(lambda c: c.execute("SELECT text FROM vector_chunks WHERE store_id = ? AND file_id = ? "
                                                  "ORDER BY seq", (store_id, file_id)).fetchall())
        return [r[0] for r in rows]


def _page(c: Any, *, store_id: str, after: tuple[str, int]) -> list[Any]:
    return list(c.execute("SELECT file_id, seq, vector FROM vector_chunks WHERE store_id = ? AND (file_id > ? OR "
                          "(file_id = ? AND seq > ?)) ORDER BY file_id, seq LIMIT ?",
                          (store_id, after[0], after[0], after[1], PAGE)).fetchall())


def _files(c: Any, store_id: str) -> tuple[int, list[Any]]:
    version = c.execute("SELECT version FROM vector_stores WHERE id = ?", (store_id,)).fetchone()
    files = c.execute("SELECT file_id, body FROM vector_store_files WHERE store_id = ? AND status = 'completed' "
                      "ORDER BY file_id", (store_id,)).fetchall()
    return (int(version[0]) if version else -1), files


def _matrix(files: list[Any], rows: list[Any]) -> Matrix:
    index = {f[0]: i for i, f in enumerate(files)}
    bodies = [json.loads(f[1]) for f in files]
    kept = [r for r in rows if r[0] in index]
    sizes = Counter(len(r[2]) for r in kept)
    if len(sizes) > 1:   # files embedded by another model than most: not searched (until added again)
        size = sizes.most_common(1)[0][0]
        log.warning("vector store: %d chunks embedded with another model are left out of the search; add their "
                    "files again", len(kept) - sizes[size])
        kept = [r for r in kept if len(r[2]) == size]
    if not kept:
        return Matrix(np.zeros((0, 0), np.float32), np.zeros(0, np.int32), np.zeros(0, np.int32), [], [], [])
    vectors = np.frombuffer(b"".join(bytes(r[2]) for r in kept), dtype=np.float32).reshape(len(kept), -1)
    return Matrix(vectors, np.fromiter((index[r[0]] for r in kept), np.int32, len(kept)),
                  np.fromiter((r[1] for r in kept), np.int32, len(kept)), [f[0] for f in files],
                  [b.get("filename", "") for b in bodies], [b.get("attributes") or {} for b in bodies])
