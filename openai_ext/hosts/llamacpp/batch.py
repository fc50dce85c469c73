"""Continuous batching for the embedded llama.cpp host.

One thread owns the llama.cpp context. Every step it builds one batch from all running
sequences and runs one ``llama_decode``: one token for each sequence that is generating, plus a
bounded chunk of prompt tokens of sequences that are still reading their prompts (so a long new
prompt never stalls the others for long), then hands each sequence the logits of its last token.

Each sequence runs in a slot (a sequence id of the context). The slots share one KV cache
(llama.cpp's unified cache), so one request may use the whole context while the others are short;
``Cells`` keeps count of the cells each slot holds. A newcomer starts once its prompt fits in
the free cells beside the running sequences' next steps (it waits otherwise, first come first
served). When the running sequences grow until a step no longer fits, the cells kept as caches go
first, then the youngest sequence is preempted: it gives its cells back and waits at the head of
the line, and when it runs again it reads its prompt and what it generated again (its samplers
keep their state), so its client sees a pause, never a different answer.

A slot keeps the cells of the sequence that last ran in it. A newcomer whose tokens start with
tokens some slot holds reuses them: in place, or shared from another slot (``llama_memory_seq_cp``
in a unified cache adds a sequence to the cells, it copies nothing). A request that shares a long
prefix with a sequence still reading it (the choices of ``n`` > 1) waits for that read to finish,
then shares it. When a newcomer takes a slot, or while nothing runs, the idle slots' cells move
to host memory, where they do not slow every step down, and come back for a newcomer that starts
with them (idle.py, stash.py).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Any, Callable

from .cells import Cells, Slot, common_prefix, sibling_reading
from .idle import IdleCells
from .plan import Part, StepCost, fill, plan_step
from .stash import LEAST_TOKENS, Stash
from .stats import Stats
from .vision import image_at
from .work import Work

log = logging.getLogger(__name__)


class Closed(RuntimeError):
    pass


class Scheduler:
    """The thread that owns the context and decodes every running sequence together."""

    # A newcomer that shares at least this many tokens with a sibling still reading them waits
    # for that read and shares its cells, rather than reading them too.
    WAIT_FOR_SIBLING = 64
    # Cells kept free for each running sequence's next steps when a newcomer is let in, so that
    # a newcomer rarely has to be preempted as soon as it started.
    HEADROOM = 16
    # A newcomer with a prompt of at most this many tokens may start before a work that waits
    # for room; each waiting work lets at most MAX_PASSES do so, so it is never starved.
    SHORT_PASS = 1024
    MAX_PASSES = 64
    # Seconds idle after which the thread ends (a submission starts another): llama.cpp built with
    # OpenMP keeps worker threads for each thread that decoded, and with two such pools (two models
    # loaded) every barrier of every decode sleeps: one model's stream went from 10.0 to 18.7 ms a token.
    IDLE_EXIT = 2.0

    def __init__(self, L: Any, ctx: Any, *, slots: int, n_batch: int, cells: int, prefill_chunk: int,
                 before_step: Callable[[], None] = lambda: None, drafter: Any = None,
                 whole_drafts: bool = False, stash_bytes: int = 0):
        self._L, self._ctx = L, ctx
        self._before_step = before_step   # (the thread count's check, on this thread)
        self._drafter = drafter           # a draft model (llamacpp/draft.py), or None
        self._whole_drafts = whole_drafts # drafts checked whole, whether or not they pay (llamacpp/plan.py)
        self._mem = L.llama_get_memory(ctx)
        self.slots = [Slot(i, []) for i in range(slots)]
        self.cells = Cells(cells, slots)
        self.stats = Stats()
        self.idle_cells = IdleCells(L, self._mem, self.slots, self.cells,
                                    Stash(L, ctx, stash_bytes) if stash_bytes > 0 else None, self.stats)
        self.n_batch = n_batch
        self.prefill_chunk = max(1, min(prefill_chunk, n_batch))
        self._batch = L.llama_batch_init(n_batch, 0, 1)
        self._cond = threading.Condition()
        self._waiting: deque[Work] = deque()
        self._running: list[Work] = []
        self._closing = False
        self._broken: BaseException | None = None
        self._counter = itertools.count()
        self._clock = itertools.count(1)
        self.cost = StepCost()
        self._thread: threading.Thread | None = None   # started by a submission, ended when idle

    def _start_thread(self) -> None:
        """(called under the lock)"""
        self._thread = threading.Thread(target=self._loop, name="llama.cpp batch", daemon=True)
        self._thread.start()

    # --- from other threads -------------------------------------------------------------------
    def submit(self, work: Work) -> None:
        with self._cond:
            if self._closing or self._broken is not None:
                raise Closed("the model is closing" if self._closing else f"the decoder stopped: {self._broken!r}")
            work.order = next(self._counter)
            self._waiting.append(work)
            if self._thread is None:
                self._start_thread()
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def counts(self) -> dict[str, int]:
        with self._cond:
            return {"slots": len(self.slots), "running": len(self._running), "waiting": len(self._waiting),
                    "cells_used": self.cells.used, "cells_total": self.cells.capacity}

    def describe(self) -> dict[str, Any]:
        stash = self.idle_cells.stash
        return {**self.counts(), **asdict(self.stats), **(stash.describe() if stash is not None else {})}

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
            thread = self._thread
            self._cond.notify()
        if thread is not None:
            thread.join()
        self._L.llama_batch_free(self._batch)
        if self.idle_cells.stash is not None:
            self.idle_cells.stash.clear()

    # --- the thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        idle_since = 0.0   # (since when nothing runs or waits; 0: something does)
        try:
            while True:
                with self._cond:
                    self._take_waiting()
                    idle = not self._running and not self._waiting
                    if idle and self._closing:
                        return
                    if idle and self.idle_cells.untidy:
                        self.idle_cells.tidy()   # (one move a pass: a submission gets in between)
                        continue
                    idle_since = (idle_since or time.monotonic()) if idle else 0.0
                    if idle and time.monotonic() - idle_since >= self.IDLE_EXIT:
                        self._thread = None   # (its OpenMP pool ends with it; submit starts another)
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
        """Gives waiting works their slots, first come first served, except that a short prompt
        may go before one that waits for room in the cache (a chat is not held up for minutes
        behind a long prompt that waits for others to finish); one that waits is passed by at
        most ``MAX_PASSES`` (called under the lock)."""
        held_up: Work | None = None   # the first work left waiting for room
        for work in list(self._waiting):
            if work.halted() or work.done:
                self._waiting.remove(work)
                work.done = True
                self._retire(work)
                continue
            free = [s for s in self.slots if s.work is None]
            if not free:
                return
            if held_up is not None and (work.end() > self.SHORT_PASS or held_up.passed >= self.MAX_PASSES):
                continue
            if not self._place(work, free):
                if held_up is None:
                    held_up = work
                continue
            self._waiting.remove(work)
            self._running.append(work)
            self.stats.most_running = max(self.stats.most_running, len(self._running))
            if held_up is not None:
                held_up.passed += 1
                self.stats.passed += 1

    def _runnable(self) -> bool:
        return any(w.done or w.halted() or w.ready() for w in self._running)

    def _place(self, work: Work, free: list[Slot]) -> bool:
        """Puts ``work`` into a free slot, reusing the longest prefix of its tokens held anywhere.
        False when it should wait: its prompt does not fit beside the running sequences yet, or a
        sibling is still reading the prefix it would share.

        The slot: the free one holding most of its prefix, then the one used longest ago, so the
        caches of recent requests (the next turn of a chat) stay."""
        limit = work.end() - 1 if work.reuse else 0   # at least one token is decoded, for its logits
        held = {s.id: common_prefix(s.held(), work.tokens, limit) for s in self.slots}
        target = min(free, key=lambda s: (-held[s.id], s.used, s.id))
        source = max(self.slots, key=lambda s: (held[s.id], s is target))
        here, there = held[target.id], held[source.id]
        if limit and sibling_reading(self._running, work.tokens, limit, there, self.WAIT_FOR_SIBLING):
            return False
        saved, kept = stash.best(work.tokens, limit) if (stash := self.idle_cells.stash) is not None else (None, 0)
        if kept < max(here, there) + LEAST_TOKENS:
            saved = None   # (a slot holds nearly as much: no copy back for a few tokens)
        # (a source kept while this waits for room is running, and the wait ends when it does)
        share = saved is None and source is not target and there > here
        # cells it takes: a copy back, for all its tokens (those past ``kept`` until they are cut below)
        need = work.end() + len(saved.tokens) - kept if saved is not None else work.end() - (there if share else here)
        freed = self.cells.freed_by_cut(target.id, 0 if share or saved else here)
        if not self.idle_cells.room(need + self.HEADROOM * len(self._running) - freed, keep=(source, target)):
            return False   # (with headroom for the running sequences' next steps)
        mem, L = self._mem, self._L
        if stash is not None and len(target.cached) >= here + LEAST_TOKENS:   # (what it holds is cut below)
            self.stats.stashed += stash.save(target.id, target.cached)
        if saved is not None and stash is not None:   # its start copied back (stash.py), the rest cut below
            self.idle_cells.stash_all(keep=(target,))   # (first: the copy goes to the first free cells)
            self.cells.cut(target.id, 0)
            here = min(kept, stash.restore(saved, target.id))
            self.cells.grow(target.id, len(saved.tokens) if here else 0)
            self.stats.restored += bool(here)
        elif share:
            L.llama_memory_seq_rm(mem, target.id, -1, -1)
            L.llama_memory_seq_cp(mem, source.id, target.id, 0, there)
            self.cells.share(source.id, target.id, there)
            self.stats.copies += 1
            here = there
        if not L.llama_memory_seq_rm(mem, target.id, here, -1):
            L.llama_memory_seq_rm(mem, target.id, -1, -1)   # a cache that cannot drop only its end
            here = 0
        self.cells.cut(target.id, here)
        target.cached, target.work, target.used = [], work, next(self._clock)
        work.slot, work.n_past = target, here
        if work.reuse:
            self.stats.reused_tokens += here
        self.idle_cells.stash_all()
        return True

    def _retire(self, work: Work) -> None:
        slot = work.slot
        if slot is not None:
            slot.cached = work.tokens[:work.n_past]   # its cells stay, as a cache for the next
            self.idle_cells.left()
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
        self._read_images()
        if self._drafter is not None:   # (it guesses for the sequences drafting with it, for this step to check)
            self._drafter.propose(list(self._running), self._before_step)   # (only this thread changes the list)
        with self._cond:
            self._leave()
            plan = self._plan()
            # The generating sequences need a cell each; when they do not fit, room is made
            while plan and sum(p.count for p in plan) > self.cells.free and self._make_room():
                plan = self._plan()
        if not plan:
            return
        n, cells = fill(self._batch, plan)
        self._before_step()
        started = time.perf_counter()
        rc = self._L.llama_decode(self._ctx, self._batch)
        if rc == 0:
            self.cost.add(n, cells, time.perf_counter() - started)
        self.stats.steps += 1
        if rc == 1:
            # llama.cpp found no room for the batch and left the cache as it was (a cache whose
            # cells this count does not follow exactly, such as a sliding window's)
            with self._cond:
                if self._make_room():
                    return
        if rc != 0:
            error = RuntimeError(f"llama_decode failed ({rc}) on a batch of {n} tokens")
            log.error("%s", error)
            with self._cond:
                for work in (p.work for p in plan):
                    work.fail(error)
                    if work.slot is not None:   # its cells may be half written: none are kept
                        self._L.llama_memory_seq_rm(self._mem, work.slot.id, -1, -1)
                        self.cells.cut(work.slot.id, 0)
                        work.n_past = 0
                self._leave()
            return
        self.stats.decoded += n
        for p in plan:
            work = p.work
            self.stats.prompt_tokens += max(0, min(work.n_past + p.real, work.prompt_len) - work.n_past)
            self.cells.grow(work.slot.id, p.count)
            work.n_past += p.real
            if work.every_logit or work.n_past >= work.end():
                accepted = work.produce(p.first, p.real, p.draft)
                if p.draft:
                    self._checked(work, len(p.draft), accepted)
        with self._cond:
            self._leave()

    def _checked(self, work: Work, drafted: int, accepted: int) -> None:
        """Drafted tokens accepted are the sequence's own now (their cells stay); the rest's go."""
        self.stats.drafted += drafted
        self.stats.accepted += accepted
        work.n_past += accepted
        if accepted < drafted:
            self._L.llama_memory_seq_rm(self._mem, work.slot.id, work.n_past, -1)
            self.cells.cut(work.slot.id, work.n_past)

    def _read_images(self) -> None:
        """Sequences whose prompt has reached an image read it now, one at a time, the others waiting
        as for a step: the projector encodes it into the sequence's cells (llamacpp/vision.py)."""
        with self._cond:
            due = [w for w in self._running if image_at(w) is not None and w.ready() and not w.halted()]
        for work in due:
            chunk, count = image_at(work)   # type: ignore[misc]
            with self._cond:
                while count > self.cells.free and self._make_room():
                    pass
                if work.slot is None or count > self.cells.free:
                    continue   # preempted, or no room yet: at a later step
            assert work.media is not None
            self._before_step()
            try:
                after = work.media.vision.evaluate(self._ctx, chunk, work.n_past, work.slot.id, self.n_batch)
            except Exception as e:  # noqa: BLE001 - this sequence fails, the others go on
                log.error("%s", e)
                with self._cond:
                    work.fail(e)
                    self._L.llama_memory_seq_rm(self._mem, work.slot.id, -1, -1)
                    self.cells.cut(work.slot.id, 0)
                    work.n_past = 0
                    self._leave()
                continue
            self.stats.steps += 1
            self.stats.decoded += count
            self.stats.prompt_tokens += count
            self.cells.grow(work.slot.id, count)
            work.n_past = after

    def _make_room(self) -> bool:
        """Frees cells for the running sequences' next step: a cached prefix of an idle slot, the
        oldest first, or else the youngest running sequence, which waits at the head of the line
        to be read again. False when neither is left (one sequence alone fills the cache).
        Called under the lock."""
        if self.idle_cells.evict_oldest():
            return True
        if len(self._running) < 2:
            return False
        victim = max(self._running, key=lambda w: w.order)
        self._running.remove(victim)
        slot = victim.slot
        held = self.cells.length(slot.id)
        self._L.llama_memory_seq_rm(self._mem, slot.id, -1, -1)
        self.cells.cut(slot.id, 0)
        slot.work, slot.cached = None, []
        victim.slot, victim.n_past = None, 0
        victim.restart()
        # the line is first come first served, and the victim came before all who wait
        at = next((i for i, w in enumerate(self._waiting) if w.order > victim.order), len(self._waiting))
        self._waiting.insert(at, victim)
        self.stats.preempted += 1
        log.info("the KV cache is full (%d cells): the newest of %d sequences gave back its %d cells and will "
                 "be read again", self.cells.capacity, len(self._running) + 1, held)
        return True

    def _plan(self) -> list[Part]:
        return plan_step(self._running, n_batch=self.n_batch, prefill_chunk=self.prefill_chunk,
                         free_cells=self.cells.free, cost=self.cost, whole_drafts=self._whole_drafts)
