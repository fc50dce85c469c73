"""Speculative decoding with a draft model, for the embedded host's batch (llamacpp/batch.py).

A smaller model of the same vocabulary guesses the next tokens of every sequence that drafts
with it (``ModelDraft``, llamacpp/speculate.py); the main model checks the guesses in its next
step as it checks prompt lookup's, so the output is the one it would have been without them.

The draft model has a context of its own, with a sequence for each slot of the batch. ``held``
says which tokens a slot's draft cells hold. Before a step, each drafting sequence's cells are
brought up to its tokens: what differs from the sequence (a rejected guess, another request that
took the slot) is dropped and the rest read, at most ``CATCH_UP`` tokens a step so that a long
prompt read by the draft model never makes one step long; a sequence drafts once it has caught up.
Then the drafting sequences go forward together, one token each per draft-model step, each taking
the draft model's most likely token while the draft model gives it at least ``P_MIN`` (a guess it
doubts is likely wrong, and costs the main model a place in its step to check).
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .cells import common_prefix
from .context import Runtime
from .plan import write

log = logging.getLogger(__name__)

# Tokens of a sequence the draft model reads in one step at most, catching up with it.
CATCH_UP = 256
# The draft model's least probability for a token it proposes (llama.cpp's default too).
P_MIN = 0.75
# Token ids below which two vocabularies may differ (byte and control tokens at the start of
# some vocabularies), and ids at the end that one may have and the other not.
VOCAB_SLACK = 128


def mismatch(main: Runtime, draft: Runtime) -> str | None:
    """Why the draft model cannot draft for the main model (their vocabularies differ), or None."""
    L = main.L
    if L.llama_vocab_type(main.vocab) != L.llama_vocab_type(draft.vocab):
        return "its tokenizer is of another type"
    if abs(main.n_vocab - draft.n_vocab) > VOCAB_SLACK:
        return f"its vocabulary has {draft.n_vocab} tokens, the model's {main.n_vocab}"
    if main.bos != draft.bos or L.llama_vocab_eos(main.vocab) != L.llama_vocab_eos(draft.vocab):
        return "its start and end tokens are other tokens"
    for t in range(min(main.n_vocab, draft.n_vocab)):
        if L.llama_vocab_get_text(main.vocab, t) != L.llama_vocab_get_text(draft.vocab, t):
            return f"its token {t} is another text"
    return None


class Drafter:
    """The draft model and its context, run on the scheduler's thread."""

    def __init__(self, path: Path, main: Runtime, *, slots: int, extra_buffers: bool, n_gpu_layers: int,
                 n_threads: int | None, flash_attn: str, cache_type_v: str):
        self.path = path
        self.rt = Runtime(path, extra_buffers=extra_buffers, n_gpu_layers=n_gpu_layers,
                          n_ctx=main.L.llama_n_ctx(main.ctx), parallel=slots, n_threads=n_threads,
                          flash_attn=flash_attn, cache_type_v=cache_type_v)
        try:
            why = mismatch(main, self.rt)
            if why is not None:
                raise ValueError(f"The draft model {path.name} cannot draft for this model: {why}. "
                                 "Give a draft model of the same family (the same tokenizer).")
        except BaseException:
            self.rt.close()
            raise
        L = self.L = self.rt.L
        self._mem = L.llama_get_memory(self.rt.ctx)
        self.n_batch = L.llama_n_batch(self.rt.ctx)
        self.capacity = L.llama_n_ctx(self.rt.ctx)
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.held: list[list[int]] = [[] for _ in range(slots)]

    def set_threads(self, gen: int, batch: int) -> None:
        self.L.llama_set_n_threads(self.rt.ctx, gen, batch)

    def propose(self, running: list[Any], before: Callable[[], None]) -> None:
        """Leaves up to the tokens each generating work drafting with this model wants guessed in
        its ``lookup.proposal`` (none for one still catching up); ``before``: called before the
        draft model decodes (the thread count's check)."""
        asks = [(w, n) for w in running
                if w.slot is not None and w.end() - w.n_past == 1 and w.ready() and (n := w.wants_draft()) > 0]
        if not asks:
            return
        before()
        reads: list[tuple[int, list[int], int]] = []   # slot, tokens to read, position of the first
        wants: dict[int, int] = {}
        works: dict[int, Any] = {}
        pending = 0   # cells the reads and drafts taken so far will fill
        keep = {w.slot.id for w, _ in asks}
        for work, most in asks:
            slot, tokens = work.slot.id, work.tokens
            have = common_prefix(self.held[slot], tokens, len(tokens) - 1)
            if have < len(self.held[slot]):
                self.L.llama_memory_seq_rm(self._mem, slot, have, -1)
                del self.held[slot][have:]
            todo = tokens[have:have + CATCH_UP]
            if not self._room(pending + len(todo) + most, keep):
                continue   # (no room in the draft cache this step: this one goes without)
            pending += len(todo) + most
            reads.append((slot, todo, have))
            works[slot] = work
            if have + len(todo) == len(tokens):
                wants[slot] = most
        guesses = self._read(reads)
        proposals: dict[int, list[int]] = {slot: [] for slot in wants}
        while guesses:
            step = []
            for slot, (token, p) in guesses.items():
                if slot not in wants or p < P_MIN:
                    continue
                proposals[slot].append(token)
                if len(proposals[slot]) < wants[slot]:
                    step.append((slot, [token], len(self.held[slot])))
            guesses = self._read(step)
        for slot, proposal in proposals.items():
            works[slot].lookup.proposal = proposal

    def _room(self, need: int, keep: set[int]) -> bool:
        """Whether ``need`` more cells fit in the draft cache, dropping the cells of slots not in
        ``keep`` (slots that do not draft now) until they do."""
        used = sum(len(h) for h in self.held)
        for slot, held in enumerate(self.held):
            if used + need <= self.capacity:
                break
            if slot not in keep and held:
                self.L.llama_memory_seq_rm(self._mem, slot, -1, -1)
                used -= len(held)
                self.held[slot] = []
        return used + need <= self.capacity

    def _read(self, reads: list[tuple[int, list[int], int]]) -> dict[int, tuple[int, float]]:
        """Decodes each slot's tokens at its positions (together, in batches of ``n_batch``); for
        each slot, the draft model's most likely next token and its probability. Empty when the
        draft model failed (its cells are then all dropped, and read again at later steps)."""
        guesses: dict[int, tuple[int, float]] = {}
        queue = deque((slot, tokens[i:i + self.n_batch], at + i, i + self.n_batch >= len(tokens))
                      for slot, tokens, at in reads for i in range(0, len(tokens), self.n_batch))
        while queue:
            batch, n = [], 0
            while queue and n + len(queue[0][1]) <= self.n_batch:
                batch.append(queue.popleft())
                n += len(batch[-1][1])
            b = self._batch
            ends: dict[int, int] = {}
            first = 0
            for slot, tokens, _, final in batch:
                first += len(tokens)
                if final:
                    ends[slot] = first - 1
            write(b, [(slot, tokens, at, len(tokens) - 1 if final else len(tokens))
                      for slot, tokens, at, final in batch])
            rc = self.L.llama_decode(self.rt.ctx, b)
            if rc != 0:
                log.warning("the draft model failed to decode (%d); its cache is cleared", rc)
                self.L.llama_memory_clear(self._mem, True)
                self.held = [[] for _ in self.held]
                return {}
            for slot, tokens, _, _ in batch:
                self.held[slot] += tokens
            for slot, output in ends.items():
                guesses[slot] = self._best(output)
        return guesses

    def _best(self, output: int) -> tuple[int, float]:
        logits = np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.rt.ctx, output), shape=(self.rt.n_vocab,))
        token = int(logits.argmax())
        return token, 1.0 / float(np.exp(logits - logits[token]).sum())

    def close(self) -> None:
        self.L.llama_batch_free(self._batch)
        self.rt.close()
