"""What one step of the batch decodes (llamacpp/batch.py): which sequences, how many tokens each,
and where in the batch, and the batch filled from that.

A step has a budget of tokens. Generating sequences come first: one token each, plus the tokens
a speculating sequence drafted (llamacpp/speculate.py), which the same step checks. The rest of the
budget reads prompts. Short prompts are read before long ones, so a chat sent beside long prompts
starts within a step or two however much the others still have to read (vLLM's chunked prefill
does the same with its short-prefill threshold); long prompts share what is left, first come first
served. While anything generates, prompts get a chunk per step, never none, so the streams that
run keep their pace and a newcomer always moves on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .vision import image_at, to_image

# A prompt with at most this many tokens left to read is read before longer ones.
SHORT_PROMPT = 256
# Prompt tokens a step reads at least while sequences generate.
LEAST_READ = 16


@dataclass
class Part:
    """One sequence's share of a step: ``count`` tokens from batch index ``first``; the last
    ``len(draft)`` of them are drafted tokens to check (a generating sequence that speculates)."""
    work: Any
    first: int
    count: int
    draft: list[int] = field(default_factory=list)

    @property
    def real(self) -> int:
        """Tokens of the sequence itself (not drafted)."""
        return self.count - len(self.draft)


def plan_step(running: list[Any], *, n_batch: int, prefill_chunk: int, free_cells: int) -> list[Part]:
    """The parts of this step, in slot order. ``free_cells``: cells left in the cache."""
    active = [w for w in running if w.ready() and w.n_past < w.end() and image_at(w) is None]
    generating = [w for w in active if w.end() - w.n_past == 1]
    reading = sorted((w for w in active if w.end() - w.n_past > 1),
                     key=lambda w: (w.end() - w.n_past > SHORT_PROMPT, w.order))
    room = min(n_batch, free_cells)
    counts = {id(w): 1 for w in generating}
    drafts: dict[int, list[int]] = {}
    room -= len(generating)
    # Drafts take what the step has beyond one token per sequence, never a prompt's least share.
    spare = room - (LEAST_READ if reading else 0)
    for w in generating:
        if spare <= 0:
            break
        draft = w.draft(spare)
        if draft:
            drafts[id(w)] = draft
            spare -= len(draft)
            room -= len(draft)
    # With nothing generating, a prompt is read as fast as the batch allows; else a chunk per step
    budget = room
    if generating:
        budget = min(budget, max(prefill_chunk - len(generating), LEAST_READ))
    for w in reading:
        if budget <= 0:
            break
        take = min(budget, w.end() - w.n_past, to_image(w))
        counts[id(w)] = take
        budget -= take
    chosen = sorted((w for w in active if id(w) in counts), key=lambda w: w.slot.id)
    parts, first = [], 0
    for w in chosen:
        draft = drafts.get(id(w), [])
        parts.append(Part(w, first, counts[id(w)] + len(draft), draft))
        first += counts[id(w)] + len(draft)
    return parts


def fill(batch: Any, parts: list[Part]) -> int:
    """Writes the parts into llama.cpp's batch; the number of tokens in it."""
    n = sum(p.count for p in parts)
    token = np.ctypeslib.as_array(batch.token, shape=(n,))
    pos = np.ctypeslib.as_array(batch.pos, shape=(n,))
    n_seq = np.ctypeslib.as_array(batch.n_seq_id, shape=(n,))
    logits = np.ctypeslib.as_array(batch.logits, shape=(n,))
    n_seq[:] = 1
    for p in parts:
        work, first, real = p.work, p.first, p.real
        token[first:first + real] = work.tokens[work.n_past:work.n_past + real]
        token[first + real:first + p.count] = p.draft
        pos[first:first + p.count] = np.arange(work.n_past, work.n_past + p.count)
        logits[first:first + p.count] = 1 if work.every_logit else 0
        if work.n_past + real >= work.end():
            # the sequence's last token, and each drafted one, give logits to sample from
            logits[first + real - 1:first + p.count] = 1
        for i in range(first, first + p.count):
            batch.seq_id[i][0] = work.slot.id
    batch.n_tokens = n
    return n
