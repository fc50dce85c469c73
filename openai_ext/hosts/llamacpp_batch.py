"""Continuous batching for the embedded llama.cpp host.

One thread owns the llama.cpp context. Every step it builds one batch from all running
sequences and runs one ``llama_decode``: one token for each sequence that is generating, plus a
bounded chunk of prompt tokens of sequences that are still reading their prompts (so a long new
prompt never stalls the others for long), then hands each sequence the logits of its last token.

Each sequence runs in a slot: a sequence id of the context with its own KV cells. The context
keeps one KV stream per slot (llama.cpp's non-unified cache): a sequence's cells lie where they
would lie if it ran alone, so its numbers, and a seeded request's text, do not depend on what
runs beside it. llama.cpp puts sequences into one compute pass only while their ids are
consecutive, so a newcomer takes a free slot next to the running ones.

A slot keeps the cells of the sequence that last ran in it. A newcomer whose tokens start with
tokens some slot holds reuses them: in place when that slot is the one it takes, or copied from
another slot (``llama_memory_seq_cp``; a whole KV stream, so only when the shared prefix is long
enough to be worth more than the copy). A request that shares a long prefix with a sequence still
reading it (the choices of ``n`` > 1) waits for that read to finish, then copies it.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class Work:
    """What a slot runs: a generation or a scoring pass. The scheduler decodes ``tokens`` into the
    slot's cells (``n_past`` of them are there) and calls ``produce`` once ``n_past`` reaches
    ``end()``; a generation then appends the token it sampled, so there is more to decode."""

    every_logit = False      # logits for every token decoded (scoring), not only the last
    reuse = True             # may start from cells a slot already holds

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        self.prompt_len = len(tokens)
        self.n_past = 0
        self.slot: Slot | None = None
        self.done = False
        self.order = 0

    def end(self) -> int:
        return len(self.tokens)

    def ready(self) -> bool:
        """False while its reader is behind: the sequence skips steps instead of running ahead."""
        return True

    def halted(self) -> bool:
        """True when it should end now (its reader left, or everything is being stopped)."""
        return False

    def halt(self) -> None:
        """Asks it to end at the next step (stop_all)."""

    def produce(self, sched: "Scheduler", first: int, count: int) -> None:
        """The logits of this step's tokens are outputs first..first+count-1 (only the last one
        unless ``every_logit``)."""

    def fail(self, error: BaseException) -> None:
        self.done = True

    def retire(self) -> None:
        """Frees what it holds (samplers). Called once, on the scheduler's thread."""


@dataclass
class Stats:
    steps: int = 0
    decoded: int = 0            # tokens decoded, prompts and generated
    prompt_tokens: int = 0      # prompt tokens decoded
    reused_tokens: int = 0      # prompt tokens taken from cells already there instead
    copies: int = 0             # slot-to-slot copies for prefix reuse
    most_running: int = 0


@dataclass
class Slot:
    id: int
    cached: list[int]            # tokens its cells hold, when no work runs in it
    work: Work | None = None
    used: int = 0                # when it last took a work (for choosing among equals)

    def held(self) -> list[int]:
        return self.work.tokens[:self.work.n_past] if self.work is not None else self.cached


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def _runs(ids: set[int]) -> int:
    """How many runs of consecutive numbers ``ids`` make."""
    return sum(1 for i in ids if i - 1 not in ids)


class Closed(RuntimeError):
    pass


class Scheduler:
    """The thread that owns the context and decodes every running sequence together."""

    def __init__(self, L: Any, ctx: Any, *, slots: int, n_batch: int, slot_cells: int, prefill_chunk: int):
        self._L, self._ctx = L, ctx
        self._mem = L.llama_get_memory(ctx)
        self.slots = [Slot(i, []) for i in range(slots)]
        self.n_batch = n_batch
        self.prefill_chunk = max(1, min(prefill_chunk, n_batch))
        # A copy moves a whole KV stream; below this many shared tokens, reading them again is cheaper.
        self.copy_min = max(64, slot_cells // 16)
        self._batch = L.llama_batch_init(n_batch, 0, 1)
        self._cond = threading.Condition()
        self._waiting: deque[Work] = deque()
        self._running: list[Work] = []
        self._closing = False
        self._broken: BaseException | None = None
        self._counter = itertools.count()
        self._clock = itertools.count(1)
        self.stats = Stats()
        self._thread = threading.Thread(target=self._loop, name="llama.cpp batch", daemon=True)
        self._thread.start()

    # --- from other threads -------------------------------------------------------------------
    def submit(self, work: Work) -> None:
        with self._cond:
            if self._closing or self._broken is not None:
                raise Closed("the model is closing" if self._closing else f"the decoder stopped: {self._broken!r}")
            work.order = next(self._counter)
            self._waiting.append(work)
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def counts(self) -> dict[str, int]:
        with self._cond:
            return {"slots": len(self.slots), "running": len(self._running), "waiting": len(self._waiting)}

    def describe(self) -> dict[str, Any]:
        return {**self.counts(), **asdict(self.stats)}

    def halt_all(self) -> None:
        """Ends every sequence running or waiting now, at the next step."""
        with self._cond:
            for work in self._running + list(self._waiting):
                work.halt()
            self._cond.notify()

    def idle(self) -> bool:
        with self._cond:
            return not self._running and not self._waiting

    def close(self) -> None:
        """Takes no new work, lets what runs and waits finish, then stops the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self._L.llama_batch_free(self._batch)

    # --- the thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    self._take_waiting()
                    if not self._running and not self._waiting and self._closing:
                        return
                    if not self._runnable():
                        # Woken by a submission, a reader catching up or leaving; the timeout
                        # only bounds how late a stop seen by nothing else is noticed.
                        self._cond.wait(timeout=0.05)
                        continue
                self._step()
        except BaseException as e:  # a bug or a llama.cpp failure: every sequence is told
            log.exception("the llama.cpp decoding thread failed")
            with self._cond:
                self._broken = e
                works = self._running + list(self._waiting)
                self._running, self._waiting = [], deque()
            for work in works:
                work.fail(e)
                self._retire(work)

    def _take_waiting(self) -> None:
        """Gives waiting works their slots, first come first served (called under the lock)."""
        while self._waiting:
            work = self._waiting[0]
            if work.halted() or work.done:
                self._waiting.popleft()
                work.done = True
                self._retire(work)
                continue
            free = [s for s in self.slots if s.work is None]
            if not free or not self._place(work, free):
                return
            self._waiting.popleft()
            self._running.append(work)
            self.stats.most_running = max(self.stats.most_running, len(self._running))

    def _runnable(self) -> bool:
        return any(w.done or w.halted() or w.ready() for w in self._running)

    def _place(self, work: Work, free: list[Slot]) -> bool:
        """Puts ``work`` into a free slot, reusing the longest prefix of its tokens held anywhere.
        False when it should wait: a sibling is still reading the prefix it would copy.

        The slot: one that keeps the running ids in as few consecutive runs as can be (each run is
        a compute pass of its own), then the one holding most of its prefix, then the one used
        longest ago, so the caches of recent requests (the next turn of a chat) stay."""
        limit = work.end() - 1 if work.reuse else 0   # at least one token is decoded, for its logits
        running = {s.id for s in self.slots if s.work is not None}
        held = {s.id: common_prefix(s.held(), work.tokens, limit) for s in self.slots}
        target = min(free, key=lambda s: (_runs(running | {s.id}), -held[s.id], s.used, s.id))
        source = max(self.slots, key=lambda s: (held[s.id], s is target))
        here, there = held[target.id], held[source.id]
        if limit and self._sibling_reading(work, limit, there):
            return False
        mem, L = self._mem, self._L
        if source is not target and there - here >= self.copy_min:
            L.llama_memory_seq_rm(mem, target.id, -1, -1)
            L.llama_memory_seq_cp(mem, source.id, target.id, -1, -1)
            self.stats.copies += 1
            here = there
        if not L.llama_memory_seq_rm(mem, target.id, here, -1):
            L.llama_memory_seq_rm(mem, target.id, -1, -1)   # a cache that cannot drop only its end
            here = 0
        target.cached, target.work, target.used = [], work, next(self._clock)
        work.slot, work.n_past = target, here
        if work.reuse:
            self.stats.reused_tokens += here
        return True

    def _sibling_reading(self, work: Work, limit: int, have: int) -> bool:
        for other in self._running:
            if other.n_past < other.end() and other.slot is not None:
                shared = common_prefix(other.tokens, work.tokens, min(limit, other.end()))
                if shared >= self.copy_min and shared > have and other.n_past < shared:
                    return True
        return False

    def _retire(self, work: Work) -> None:
        slot = work.slot
        if slot is not None:
            slot.cached = work.tokens[:work.n_past]   # its cells stay, as a cache for the next
            slot.work = None
            work.slot = None
        try:
            work.retire()
        except Exception:  # noqa: BLE001 - freeing must not stop the others
            log.exception("freeing a finished sequence failed")

    def _leave(self) -> None:
        """Finished, failed and stopped works leave their slots (called under the lock)."""
        for work in [w for w in self._running if w.done or w.halted()]:
            self._running.remove(work)
            work.done = True
            self._retire(work)

    def _step(self) -> None:
        with self._cond:
            self._leave()
            plan = self._plan()
        if not plan:
            return
        n = self._fill(plan)
        rc = self._L.llama_decode(self._ctx, self._batch)
        self.stats.steps += 1
        if rc != 0:
            error = RuntimeError(f"llama_decode failed ({rc}) on a batch of {n} tokens")
            log.error("%s", error)
            with self._cond:
                for work, _, _ in plan:
                    work.fail(error)
                    if work.slot is not None:   # its cells may be half written: none are kept
                        self._L.llama_memory_seq_rm(self._mem, work.slot.id, -1, -1)
                        work.n_past = 0
                self._leave()
            return
        self.stats.decoded += n
        for work, first, count in plan:
            self.stats.prompt_tokens += max(0, min(work.n_past + count, work.prompt_len) - work.n_past)
            work.n_past += count
            if work.every_logit or work.n_past >= work.end():
                work.produce(self, first, count)
        with self._cond:
            self._leave()

    def _plan(self) -> list[tuple[Work, int, int]]:
        """(work, first batch index, token count) for this step, in slot order."""
        active = [w for w in self._running if w.ready() and w.n_past < w.end()]
        generating = [w for w in active if w.end() - w.n_past == 1]
        reading = sorted((w for w in active if w.end() - w.n_past > 1), key=lambda w: w.order)
        # With nothing generating, a prompt is read as fast as the batch allows; else a chunk per
        # step, never none, so a newcomer always moves on.
        budget = self.n_batch - len(generating)
        if generating:
            budget = min(budget, max(self.prefill_chunk - len(generating), 16))
        counts = {id(w): 1 for w in generating}
        for w in reading:
            if budget <= 0:
                break
            take = min(budget, w.end() - w.n_past)
            counts[id(w)] = take
            budget -= take
        chosen = sorted((w for w in active if id(w) in counts), key=lambda w: w.slot.id)
        plan, first = [], 0
        for w in chosen:
            plan.append((w, first, counts[id(w)]))
            first += counts[id(w)]
        return plan

    def _fill(self, plan: list[tuple[Work, int, int]]) -> int:
        b = self._batch
        n = sum(count for _, _, count in plan)
        token = np.ctypeslib.as_array(b.token, shape=(n,))
        pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        n_seq = np.ctypeslib.as_array(b.n_seq_id, shape=(n,))
        logits = np.ctypeslib.as_array(b.logits, shape=(n,))
        n_seq[:] = 1
        for work, first, count in plan:
            token[first:first + count] = work.tokens[work.n_past:work.n_past + count]
            pos[first:first + count] = np.arange(work.n_past, work.n_past + count)
            logits[first:first + count] = 1 if work.every_logit else 0
            if work.n_past + count >= work.end():
                logits[first + count - 1] = 1
            for i in range(first, first + count):
                b.seq_id[i][0] = work.slot.id
        b.n_tokens = n
        return n
