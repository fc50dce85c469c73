"""The search index: each vector store's chunks as one float32 matrix in memory, searched exactly.

Why this index: a vector store here holds what one user or one application uploaded, thousands to
a few hundred thousand chunks. At that size an exact search (one matrix-vector product, numpy's
BLAS on every core) takes milliseconds (bench/bench_vector_stores.py) and finds every true
neighbour, where an approximate index (HNSW) trades recall for speed that only pays at millions,
and needs an extension in the database (sqlite-vec, pgvector) that a user's SQLite or PostgreSQL
may not have. The store (SQLite, or PostgreSQL with database_url) stays the one source of truth,
so replicas that share it search the same chunks; each instance builds the matrix of a store on
its first search and again when the store's version moves, and keeps the most recently used
matrices within ``vector_cache_mb``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .chunk_rows import Matrix
from .filters import Comparison, Compound, holds

MASKS = 64   # filters' file masks kept per matrix

@dataclass(frozen=True)
class Hit:
    file: int          # index into the matrix's files
    seq: int
    score: float


class Indexes:
    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self._kept: OrderedDict[str, tuple[int, Matrix]] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}   # a store's load, one at a time

    def get(self, store_id: str, version: int, load: Callable[[], tuple[Matrix, int]]) -> Matrix:
        """The store's matrix of ``version`` or newer: the one kept, or ``load``'s. Searches that
        find it missing at once wait for one load (not one each)."""
        found = self._kept_at(store_id, version)
        if found is not None:
            return found
        with self._lock:
            loading = self._loading.setdefault(store_id, threading.Lock())
        with loading:
            found = self._kept_at(store_id, version)   # (loaded while this search waited)
            if found is not None:
                return found
            try:
                matrix, loaded = load()
            finally:
                with self._lock:   # (searches waiting hold the lock itself; later ones find the matrix)
                    if self._loading.get(store_id) is loading:
                        del self._loading[store_id]
            with self._lock:
                self._kept[store_id] = (loaded, matrix)
                self._kept.move_to_end(store_id)
                while len(self._kept) > 1 and sum(m.vectors.nbytes for _, m in self._kept.values()) > self.limit:
                    self._kept.popitem(last=False)
            return matrix

    def _kept_at(self, store_id: str, version: int) -> Matrix | None:
        with self._lock:
            kept = self._kept.get(store_id)
            if kept is None or kept[0] < version:
                return None
            self._kept.move_to_end(store_id)
            return kept[1]

    def forget(self, store_id: str) -> None:
        with self._lock:
            self._kept.pop(store_id, None)
            self._loading.pop(store_id, None)


def search(matrix: Matrix, queries: np.ndarray, *, filters: Comparison | Compound | None, threshold: float,
           most: int) -> list[Hit]:
    """The ``most`` chunks nearest any of ``queries`` (unit rows) that pass ``filters``, best first,
    scoring at least ``threshold``. The score is the cosine similarity, below zero counted as zero
    (the API's scores lie in [0, 1])."""
    if not len(matrix.files) or not queries.size:
        return []
    scores = matrix.vectors @ queries.T if queries.ndim == 2 else matrix.vectors @ queries
    if scores.ndim == 2:
        scores = scores.max(axis=1)
    if filters is not None:
        scores = np.where(_allowed(matrix, filters)[matrix.owners], scores, -np.inf)
    np.clip(scores, 0.0, 1.0, out=scores, where=np.isfinite(scores))
    keep = np.flatnonzero(scores >= threshold)
    if keep.size > most:
        keep = keep[np.argpartition(-scores[keep], most - 1)[:most]]
    keep = keep[np.lexsort((keep, -scores[keep]))]   # best first; ties in the store's order
    return [Hit(int(matrix.owners[i]), int(matrix.seqs[i]), float(scores[i])) for i in keep]


def _allowed(matrix: Matrix, filters: Comparison | Compound) -> np.ndarray:
    """The files ``filters`` lets through, worked out once per matrix (attributes change only with
    the store's version, which makes a new matrix)."""
    key = filters.model_dump_json()
    with matrix.lock:
        mask = matrix.masks.get(key)
    if mask is None:
        mask = np.fromiter((holds(filters, a) for a in matrix.attributes), bool, len(matrix.files))
        with matrix.lock:
            if len(matrix.masks) >= MASKS:
                matrix.masks.pop(next(iter(matrix.masks)))
            matrix.masks[key] = mask
    return mask


def mean_vectors(pieces: np.ndarray, counts: list[int]) -> np.ndarray:
    """Each chunk's vector from its pieces' (``counts[i]`` rows each): their mean, made unit length."""
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.intp)
    sums = np.add.reduceat(pieces.astype(np.float32), starts, axis=0)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return np.asarray(sums / np.where(norms == 0, 1, norms), dtype=np.float32)


def as_unit(vectors: Any) -> np.ndarray:
    out = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(out, axis=-1, keepdims=True)
    return np.asarray(out / np.where(norms == 0, 1, norms), dtype=np.float32)
