"""Which KV cells each sequence holds, in the cache the sequences share.

The embedded host keeps one KV cache for all its sequences (llama.cpp's unified cache): one
request may use the whole context while the others are short. A cell belongs to every sequence
that holds it, so a prefix copied from one sequence to another (``llama_memory_seq_cp``) costs
no cell, and a cell is free again once no sequence holds it. llama.cpp does not tell how many
cells are in use; the scheduler keeps this map beside its own calls to ``llama_memory_*``, so it
knows before a step whether the step fits and how much a sequence would free.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np


class Cells:
    def __init__(self, capacity: int, sequences: int):
        self.capacity = capacity
        self._held: list[list[int]] = [[] for _ in range(sequences)]   # cell ids, by position
        self._refs: dict[int, int] = {}                                 # cell id -> sequences holding it
        self._ids = itertools.count()

    @property
    def used(self) -> int:
        return len(self._refs)

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def length(self, seq: int) -> int:
        """Positions 0..length-1 of ``seq`` have cells."""
        return len(self._held[seq])

    def grow(self, seq: int, count: int) -> None:
        """``count`` new cells at the end of ``seq`` (tokens just decoded)."""
        new = [next(self._ids) for _ in range(count)]
        self._held[seq].extend(new)
        self._refs.update(dict.fromkeys(new, 1))

    def cut(self, seq: int, keep: int) -> None:
        """``seq`` lets go of its cells from position ``keep`` on."""
        held = self._held[seq]
        for cell in held[keep:]:
            n = self._refs[cell] - 1
            if n:
                self._refs[cell] = n
            else:
                del self._refs[cell]
        del held[keep:]

    def freed_by_cut(self, seq: int, keep: int) -> int:
        """Cells that ``cut(seq, keep)`` would free (those no other sequence holds)."""
        return sum(1 for cell in self._held[seq][keep:] if self._refs[cell] == 1)

    def share(self, source: int, target: int, count: int) -> None:
        """``target`` holds the first ``count`` cells of ``source`` instead of its own."""
        self.cut(target, 0)
        cells = self._held[source][:count]
        for cell in cells:
            self._refs[cell] += 1
        self._held[target] = list(cells)


@dataclass
class Slot:
    id: int
    cached: list[int]            # tokens its cells hold, when no work runs in it
    work: Any = None             # the Work that runs in it (llamacpp/work.py)
    used: int = 0                # when it last took a work (for choosing among equals)

    def held(self) -> list[int]:
        return self.work.tokens[:self.work.n_past] if self.work is not None else self.cached


def common_prefix(a: list[int] | np.ndarray, b: list[int] | np.ndarray, limit: int) -> int:
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def sibling_reading(running: list[Any], tokens: list[int], limit: int, have: int, least: int) -> bool:
    """Whether one of the ``running`` works is still reading at least ``least`` of the first
    ``limit`` of ``tokens`` (more than the ``have`` a slot holds already): a newcomer then waits
    for that read and shares its cells, rather than reading them too (llamacpp/batch.py)."""
    for other in running:
        if other.n_past < other.end() and other.slot is not None:
            shared = common_prefix(other.tokens, tokens, min(limit, other.end()))
            if shared >= least and shared > have and other.n_past < shared:
                return True
    return False
