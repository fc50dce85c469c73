"""Idle slots' cells kept in host memory instead of the KV cache (llamacpp/batch.py).

A slot keeps the cells of the sequence that last ran in it, so that the next turn of a chat, or
another request with the same start, reads only what is new. But every step attends over the
whole stretch of the cache in use, other sequences' cells included: llama.cpp masks them, and
still goes through them. One stream beside 1,000 cells of idle slots decoded a token in 9.5 ms
where it took 7.2-8.6 alone (the embedded model, two cores), and one stream after a round of eight
ran at 0.93x llama-server's speed where alone it ran at 0.97-0.99x. llama-server saves idle slots
into host memory and clears them when a new request starts; so does this scheduler.

When a request takes a slot, or while nothing runs (idle.py), every other idle slot's sequence is
copied here (``llama_state_seq_get_data``) and its cells are freed; so is the taken slot's own
sequence where the request shares only its start (the same system prompt) and cuts the rest. A
later request whose tokens start with more of a saved sequence than any slot holds has it copied
back into its slot (``llama_state_seq_set_data``: a copy of memory, where reading those tokens
again would take a step of the model for every few hundred of them), then reads the rest. The
copies take at most ``cache_ram_mb`` of memory; the least recently saved go first.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cells import common_prefix

log = logging.getLogger(__name__)

# Shorter sequences are not kept: reading them again takes one step.
LEAST_TOKENS = 32
# Sequences kept at most, however small: every newcomer is compared with each.
MOST_KEPT = 64
# Larger sequences are not moved together (compact): a request that comes meanwhile waits for
# the copy (4.4 MB decoded beside seven others moved out and back in 3.3 ms here: 64 MB, ~50 ms).
MOST_COMPACTED = 64 * 2 ** 20


@dataclass(eq=False)   # (each copy is itself: its tokens are an array)
class Saved:
    tokens: np.ndarray
    data: np.ndarray         # the bytes llama.cpp wrote
    used: int


class Stash:
    """Copies of idle sequences' cells in host memory, at most ``budget`` bytes (on the scheduler's
    thread only)."""

    def __init__(self, L: Any, ctx: Any, budget: int):
        self._L, self._ctx = L, ctx
        self.budget = budget
        self._saved: list[Saved] = []
        self._clock = itertools.count(1)
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._saved)

    def save(self, seq: int, tokens: list[int]) -> bool:
        """Copies sequence ``seq``'s cells (holding ``tokens``) here; False where it is not kept."""
        if len(tokens) < LEAST_TOKENS or min(tokens) < 0:   # (an image's tokens: their ids say nothing of it)
            return False
        data = self._copy_out(seq, self.budget)
        if data is None:
            return False
        size = len(data)
        held = np.asarray(tokens)
        # a copy whose tokens this one starts with says nothing this one does not
        for old in [s for s in self._saved if common_prefix(s.tokens, held, len(held)) == len(s.tokens)]:
            self._drop(old)
        while self._saved and (self.bytes + size > self.budget or len(self._saved) >= MOST_KEPT):
            self._drop(min(self._saved, key=lambda s: s.used))
        self._saved.append(Saved(held, data, next(self._clock)))
        self.bytes += size
        return True

    def best(self, tokens: list[int], limit: int) -> tuple[Saved | None, int]:
        """The saved sequence that shares the most of ``tokens`` (at most ``limit``), and how many."""
        found, most = None, 0
        if self._saved and limit > 0:
            wanted = np.asarray(tokens[:limit])
            for saved in self._saved:
                n = common_prefix(saved.tokens, wanted, limit)
                if n > most:
                    found, most = saved, n
        return found, most

    def restore(self, saved: Saved, seq: int) -> int:
        """Copies ``saved`` into sequence ``seq`` (whose cells go first): the tokens it holds now,
        0 where llama.cpp could not (no room)."""
        if saved in self._saved:   # (room made for it may have pushed it out: its bytes are still here)
            self._drop(saved)
        if not self._L.llama_state_seq_set_data(self._ctx, _pointer(saved.data), len(saved.data), seq):
            log.warning("a prompt kept in host memory could not be put back into the KV cache: it is read again")
            return 0
        return len(saved.tokens)

    def compact(self, seq: int) -> bool | None:
        """Copies sequence ``seq``'s cells out and back in, so that they lie together at the first
        free cells (llamacpp/idle.py); the copy does not stay here. True where they moved, None
        where they were left as they were (too large), False where llama.cpp took them
        and could not put them back."""
        data = self._copy_out(seq, min(self.budget, MOST_COMPACTED))
        if data is None:
            return None
        if not self._L.llama_state_seq_set_data(self._ctx, _pointer(data), len(data), seq):
            log.warning("a sequence moved within the KV cache could not be put back: it is read again")
            return False
        return True

    def _copy_out(self, seq: int, most: int) -> np.ndarray | None:
        """Sequence ``seq``'s cells as llama.cpp writes them; None where they take more than
        ``most`` bytes, or llama.cpp wrote none."""
        size = self._L.llama_state_seq_get_size(self._ctx, seq)
        if not size or size > most:
            return None
        data = np.empty(size, np.uint8)   # (not zeroed, nor a ctypes type made for each size: 0.1-2 ms)
        if self._L.llama_state_seq_get_data(self._ctx, _pointer(data), size, seq) != size:
            return None
        return data

    def _drop(self, saved: Saved) -> None:
        self._saved.remove(saved)
        self.bytes -= len(saved.data)

    def describe(self) -> dict[str, Any]:
        return {"stash_sequences": len(self._saved), "stash_mb": round(self.bytes / 2 ** 20, 1)}

    def clear(self) -> None:
        self._saved.clear()
        self.bytes = 0


def _pointer(data: np.ndarray) -> Any:
    return data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
