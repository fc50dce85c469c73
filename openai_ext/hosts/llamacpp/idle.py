"""What becomes of the cells an idle slot keeps (llamacpp/batch.py).

A slot keeps the cells of the sequence that last ran in it, so that the next turn of a chat, or
another request with the same start, reads only what is new. But every step attends over the
whole stretch of the cache in use, idle slots' cells included, so they do not stay long:

- when a newcomer takes a slot, the other idle slots' cells are copied to host memory and freed
  (stash.py), and come back for a newcomer that starts with them;
- while nothing runs or waits, that copy is made at once, so that the next newcomer does not
  wait for it (22-30 ms before the first token of a request after a round of eight), except for
  the slot used last (the next turn of the latest conversation): its cells are copied out and
  back, so that they lie together at the start of the cache instead of every few cells of the
  stretch the sequences decoded together filled;
- when room is needed (a newcomer's prompt, the running sequences' next step), they are dropped,
  the oldest first, where host memory did not take them.
"""

from __future__ import annotations

from typing import Any

from .cells import Cells, Slot
from .stash import Stash
from .stats import Stats


class IdleCells:
    """The idle slots' cells (on the scheduler's thread only). ``stash``: None where host memory
    keeps none (the setting ``cache_ram_mb`` 0): idle cells then stay until room is needed."""

    def __init__(self, L: Any, mem: Any, slots: list[Slot], cells: Cells, stash: Stash | None, stats: Stats):
        self._L, self._mem = L, mem
        self._slots, self._cells = slots, cells
        self.stash = stash
        self._stats = stats
        self.untidy = False   # a sequence left its cells in a slot since the last tidy()
        self._tried: set[int] = set()   # slots the tidy has moved out, or tried to

    def left(self) -> None:
        """A sequence ended and left its cells in its slot."""
        self.untidy = self.stash is not None
        self._tried.clear()

    def room(self, want: int, *, keep: tuple[Slot, ...] = ()) -> bool:
        """Whether ``want`` cells are free, once idle slots' cells (not those of ``keep``) are
        moved out or dropped, the oldest first, until they are."""
        if want <= self._cells.free:
            return True
        for slot in sorted((s for s in self._slots if s.work is None and s.cached and s not in keep),
                           key=lambda s: s.used):
            self.evict(slot)
            if want <= self._cells.free:
                return True
        return False

    def evict_oldest(self) -> bool:
        """Frees the cells of the idle slot used longest ago; False where no idle slot holds any."""
        held = [s for s in self._slots if s.work is None and s.cached]
        if held:
            self.evict(min(held, key=lambda s: s.used))
        return bool(held)

    def stash_all(self, *, keep: tuple[Slot, ...] = ()) -> None:
        """Every idle slot's cells (but those of ``keep``) to host memory (those it cannot keep stay)."""
        for slot in self._slots if self.stash is not None else []:
            if slot.work is None and slot.cached and slot not in keep:
                self.evict(slot, room=False)

    def evict(self, slot: Slot, *, room: bool = True) -> None:
        """Moves an idle slot's cells to host memory; ``room``: dropped even where it does not keep them."""
        saved = self.stash is not None and self.stash.save(slot.id, slot.cached)
        self._stats.stashed += saved
        if not saved and not room:
            return
        self._L.llama_memory_seq_rm(self._mem, slot.id, -1, -1)
        self._cells.cut(slot.id, 0)
        slot.cached = []
        self._stats.evicted += room

    def tidy(self) -> None:
        """While nothing runs: one move of the tidy, the idle slots' cells to host memory (the
        oldest first), then the last used one's moved together. Called under the scheduler's lock
        (its count of cells and llama.cpp's agree there), one move a pass, so that a request that
        comes is placed between two (its placement moves what is left, as it did before)."""
        held = sorted((s for s in self._slots if s.work is None and s.cached), key=lambda s: s.used)
        for slot in held[:-1]:
            if slot.id not in self._tried:   # (one host memory did not keep stays: tried once)
                self._tried.add(slot.id)
                self.evict(slot, room=False)
                return
        # (a sequence holding an image stays where it is, as the stash leaves it: an image's cells
        # may carry positions of their own, M-RoPE's, which this copy has not been tried with)
        if self._tried and held and self.stash is not None and min(held[-1].cached) >= 0:   # (others held cells)
            last = held[-1]
            moved = self.stash.compact(last.id)
            if moved is False:   # (llama.cpp took its cells and could not put them back)
                self._cells.cut(last.id, 0)
                last.cached = []
            self._stats.compacted += bool(moved)
        self.untidy = False
