"""What one step of the batch decodes (llamacpp/batch.py): which sequences, how many tokens each,
and where in the batch, and the batch filled from that.

A step has a budget of tokens. Generating sequences come first: one token each, plus the tokens
a speculating sequence drafted (llamacpp/speculate.py), which the same step checks. The rest of the
budget reads prompts. Short prompts are read before long ones, so a chat sent beside long prompts
starts within a step or two however much the others still have to read (vLLM's chunked prefill
does the same with its short-prefill threshold); long prompts share what is left, first come first
served. While anything generates, prompts get a chunk per step, never none, so the streams that
run keep their pace and a newcomer always moves on.

A step's tokens do not all cost the same: each attends to every cell before it, so a chunk deep
into a long prompt costs many times one at its start (with a small model, 128 tokens 5,000 cells in
took 3 s on two cores). So where latency matters, the prompt tokens of a step are bounded by the
time the step is predicted to take (``StepCost``, fitted to the steps just decoded), not only by
their count: a stream beside long prompts keeps a short step, and a step is never so long that a
newcomer waits seconds for it to end.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .vision import image_at, to_image

# A prompt with at most this many tokens left to read is read before longer ones.
SHORT_PROMPT = 256
# Prompt tokens a step reads at least while sequences generate.
LEAST_READ = 16
# Seconds a step is meant to take at most: while sequences generate, while only prompts are read
# (a newcomer waits for the step in flight to end, so this is half its wait at most), and while
# a live client's short prompt is read to its end (its first token waits for this step).
STEP_GENERATING = 0.5
STEP_READING = 0.5
STEP_FIRST = 0.25


# llama.cpp's flash attention on the CPU reads the queries of a step of this many tokens or more
# a tile at a time, and those of a smaller step one by one (its GGML_FA_TILE_Q): on two cores, a
# step of 64 tokens 4,000 cells deep took 670 ms where one of 48 took 900 (Qwen2.5-Coder-0.5B;
# the embedded model 3,000 deep: 553 ms against 737 for 63). So steps of either kind are fitted
# apart; where both kinds cost alike (a GPU, attention without flash) the two fits agree.
TILED = 64


class StepCost:
    """Predicts the seconds a step takes from its tokens and the cells they attend to, by least
    squares over the last steps timed (seconds = fixed + per token x tokens + per cell x cells
    attended), steps of fewer than ``TILED`` tokens and steps of more fitted apart. A kind not
    yet timed is predicted by the other's fit. Until enough steps are seen, or when the fit says
    nothing, it predicts nothing and steps are bounded by their token counts alone."""

    def __init__(self) -> None:
        self._kinds = (LinearCost(), LinearCost())   # steps of fewer than TILED tokens; of TILED or more

    def add(self, tokens: int, cells: int, seconds: float) -> None:
        self._kinds[tokens >= TILED].add(tokens, cells, seconds)

    def fitted(self, tokens: int = 1) -> tuple[float, float, float] | None:
        """(fixed, per token, per cell attended) in seconds for a step of ``tokens`` tokens; None
        while it cannot tell."""
        large = tokens >= TILED
        fit = self._kinds[large].fitted()
        return fit if fit is not None else self._kinds[not large].fitted()

    def ready(self) -> bool:
        return self.fitted() is not None

    def chunk(self, seconds: float, at: int, tokens: int = 0, cells: int = 0) -> int | None:
        """Prompt tokens from position ``at`` that a step already holding ``tokens`` tokens and
        ``cells`` cells may add and take ``seconds`` at most; None when it cannot tell. The most
        of either kind of step: a step that reaches ``TILED`` tokens may hold more than one short
        of it does."""
        most = None
        for large in (False, True):
            fit = self.fitted(TILED if large else 1)
            if fit is None:
                return None
            fixed, per_token, per_cell = fit
            left = seconds - fixed - per_token * tokens - per_cell * cells
            c = left / max(per_token + per_cell * at, 1e-9)
            # (the chunk's own tokens attend to each other too: half the chunk more on average)
            take = max(0, int(left / max(per_token + per_cell * (at + c / 2), 1e-9)))
            if not large:
                take = min(take, max(0, TILED - 1 - tokens))
            elif tokens + take < TILED:
                continue
            most = take if most is None else max(most, take)
        return most

    def predict(self, tokens: int, cells: int) -> float:
        fit = self.fitted(tokens)
        if fit is None:
            return 0.0
        fixed, per_token, per_cell = fit
        return fixed + per_token * tokens + per_cell * cells

    def predict_each(self, tokens: np.ndarray, cells: np.ndarray) -> np.ndarray:
        """``predict`` for each pair of the two arrays (zeros while it cannot tell)."""
        out = np.zeros(len(tokens))
        for large in (False, True):
            fit = self.fitted(TILED if large else 1)
            if fit is not None:
                kind = (tokens >= TILED) == large
                out[kind] = fit[0] + fit[1] * tokens[kind] + fit[2] * cells[kind]
        return out


class LinearCost:
    """One kind of step's fit (StepCost): least squares over the last ``KEEP`` steps timed."""

    KEEP = 64
    LEAST = 4

    def __init__(self) -> None:
        self._seen: deque[tuple[float, float, float]] = deque(maxlen=self.KEEP)
        self._fit: tuple[float, float, float] | None = None
        self._stale = 0.0      # seconds of the steps added since the last fit (fitted when next asked)
        self._fitted_once = False

    # A fit is made again once the steps timed since the last took this long. A fit costs 0.2-0.3
    # ms on a CPU warm, 0.5-0.6 ms right after a decode (the model's weights have taken the caches):
    # made every tenth of a second, it was a fifth of the Python between two steps of one stream
    # (50-60 of 270 us a step); now it is about 0.1% of the decoding time. A step of half a second
    # (a prompt read while nothing else runs) is followed by a fit; shorter ones (beside a stream,
    # or a newcomer's first step) by one every second or third step.
    REFIT_SECONDS = 0.5

    def add(self, tokens: int, cells: int, seconds: float) -> None:
        self._seen.append((tokens, cells, seconds))
        self._stale += max(seconds, 1e-9)

    def fitted(self) -> tuple[float, float, float] | None:
        due = self._stale >= self.REFIT_SECONDS or (self._stale > 0 and not self._fitted_once)
        if due and len(self._seen) >= self.LEAST:
            data = np.array(self._seen)
            x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
            fit = nonnegative_fit(x, data[:, 2])
            self._fit = (fit[0], fit[1], fit[2]) if fit[1] > 0 or fit[2] > 0 else None
            self._stale, self._fitted_once = 0.0, True
        return self._fit


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares with no coefficient below zero (no cost is negative): the best fit over the
    subsets of columns whose own fit has none (few columns, so every subset is tried)."""
    best, best_error = [0.0] * x.shape[1], float(np.sum(y * y))
    for mask in range(1, 1 << x.shape[1]):
        cols = [i for i in range(x.shape[1]) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        error = float(np.sum((x[:, cols] @ coef - y) ** 2))
        if error < best_error:
            best, best_error = [0.0] * x.shape[1], error
            for i, c in zip(cols, coef, strict=True):
                best[i] = float(c)
    return best


def attended(at: int, count: int) -> int:
    """Cells that ``count`` tokens from position ``at`` attend to, together."""
    return count * at + count * (count + 1) // 2


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


def plan_step(running: list[Any], *, n_batch: int, prefill_chunk: int, free_cells: int,
              cost: StepCost | None = None, whole_drafts: bool = False) -> list[Part]:
    """The parts of this step, in slot order. ``free_cells``: cells left in the cache;
    ``whole_drafts``: drafts are checked whole, whether or not they pay."""
    active = [w for w in running if w.ready() and w.n_past < w.end() and image_at(w) is None]
    foreground = any(not w.background for w in active)
    if any(not w.background and w.end() - w.n_past > 1 for w in active):
        # A live client's prompt is read: background work (a batch's lines) sits this step out,
        # so the client's first token waits for no batch line's decode; unless the live work can
        # make no step of its own (no room for its prompt yet), which would stall everything.
        parts = _plan([w for w in active if not w.background], True, n_batch=n_batch,
                      prefill_chunk=prefill_chunk, free_cells=free_cells, cost=cost, whole_drafts=whole_drafts)
        if parts:
            return parts
    return _plan(active, foreground, n_batch=n_batch, prefill_chunk=prefill_chunk, free_cells=free_cells, cost=cost,
                 whole_drafts=whole_drafts)


def _plan(active: list[Any], foreground: bool, *, n_batch: int, prefill_chunk: int, free_cells: int,
          cost: StepCost | None, whole_drafts: bool) -> list[Part]:
    """``plan_step`` over the works that may run; ``foreground``: live work runs (background work
    drafts nothing then)."""
    generating = [w for w in active if w.end() - w.n_past == 1]
    reading = sorted((w for w in active if w.end() - w.n_past > 1),
                     key=lambda w: (w.end() - w.n_past > SHORT_PROMPT, w.order))
    room = min(n_batch, free_cells)
    counts = {id(w): 1 for w in generating}
    drafts: dict[int, list[int]] = {}
    room -= len(generating)
    # the step's tokens and the cells they attend to so far (for what the step is predicted to take)
    tokens, cells = len(generating), sum(attended(w.n_past, 1) for w in generating)
    # Drafts take what the step has beyond one token per sequence, never a prompt's least share.
    spare = room - (LEAST_READ if reading else 0)
    # Drafts are cut to what pays once steps are timed; until then, and where drafts are checked
    # whole, they are kept as drafted. (A step of one token each: its time per token produced.)
    judge = cost if cost is not None and not whole_drafts and cost.ready() else None
    per_output = judge.predict(tokens, cells) / tokens if judge is not None and generating else 0.0
    for w in generating:
        if spare <= 0:
            break
        if w.background and foreground:
            continue   # (drafts make a step longer: background work drafts only on its own)
        draft = w.draft(spare, judge is not None)
        if judge is not None:
            draft = paying(w, draft, per_output, judge, tokens, cells)
        if draft:
            drafts[id(w)] = draft
            spare -= len(draft)
            room -= len(draft)
            tokens += len(draft)
            cells += attended(w.n_past + 1, len(draft))
    # With nothing generating, a prompt is read as fast as the batch allows; else a chunk per step
    budget = room
    if generating:
        budget = min(budget, max(prefill_chunk - len(generating), LEAST_READ))
    # and the time the step may take, for the long prompts (short ones are read whole)
    # (asked only while prompts are read: a step of streams alone pays for no fit)
    seconds = None
    if cost is not None and reading and not cost.ready():
        budget = min(budget, prefill_chunk)   # (no step timed yet: a chunk, as beside a stream)
    elif cost is not None and reading:
        newcomer = any(not w.background and w.end() - w.n_past <= SHORT_PROMPT for w in reading)
        seconds = STEP_FIRST if newcomer else STEP_GENERATING if generating else STEP_READING
    first_long = next((w for w in reading if w.end() - w.n_past > SHORT_PROMPT), None)
    for w in reading:
        if budget <= 0:
            break
        take = min(budget, w.end() - w.n_past, to_image(w))
        if cost is not None and seconds is not None and w.end() - w.n_past > SHORT_PROMPT:
            fits = cost.chunk(seconds, w.n_past, tokens, cells)
            if fits is not None:   # (the first long prompt always moves on, by the least share: deep
                # in a long prompt, 64 tokens took seconds on two cores, and a newcomer waits for them)
                take = min(take, max(fits, LEAST_READ if w is first_long else 0))
        if take <= 0:
            break
        tokens += take
        cells += attended(w.n_past, take)
        counts[id(w)] = take
        budget -= take
    chosen = sorted((w for w in active if id(w) in counts), key=lambda w: w.slot.id)
    parts, first = [], 0
    for w in chosen:
        draft = drafts.get(id(w), [])
        parts.append(Part(w, first, counts[id(w)] + len(draft), draft))
        first += counts[id(w)] + len(draft)
    return parts


def paying(work: Any, draft: list[int], per_output: float, cost: StepCost, tokens: int, cells: int) -> list[int]:
    """The part of ``draft`` worth checking in a step that holds ``tokens`` tokens attending to
    ``cells`` cells so far: the length whose expected saving is the largest. A drafted token
    saves, where it is accepted, ``per_output`` (a step's time per token produced), at the chance
    the sequence's drafts so far give the i-th drafted token (speculate.Pace.chances); the draft
    costs what the step is predicted to take with it more than without. On a CPU where the step's
    cost grows with each token (one token 2,400 cells deep took 27 ms, sixteen 286 ms), only a
    draft accepted nearly always pays, and a draft that makes the step ``TILED`` tokens long may
    cost less than a shorter one; where a step's fixed cost rules (a GPU), most drafts do."""
    if not draft:
        return draft
    k = np.arange(len(draft) + 1)
    saved = per_output * np.concatenate(([0.0], np.cumsum(work.chances(len(draft)))))
    with_draft = cost.predict_each(tokens + k, cells + k * (work.n_past + 1) + k * (k + 1) // 2)
    kept = int(np.argmax(saved - (with_draft - with_draft[0])))   # (the shortest of equals; 0 where none pays)
    if not kept and work.probe():
        kept = 1   # (now and then all the same, so that the rate and the costs are learnt: Pace.probe)
    return draft[:kept]


def fill(batch: Any, parts: list[Part]) -> tuple[int, int]:
    """Writes the parts into llama.cpp's batch: the number of tokens in it, and the cells they
    attend to (for StepCost)."""
    rows = []
    cells = 0
    for p in parts:
        work, real = p.work, p.real
        cells += attended(work.n_past, p.count)
        tokens = [*work.tokens[work.n_past:work.n_past + real], *p.draft]
        # the sequence's last token, and each drafted one, give logits to sample from
        last = work.n_past + real >= work.end()
        rows.append((work.slot.id, tokens, work.n_past, 0 if work.every_logit else real - 1 if last else p.count))
    return write(batch, rows), cells


# A batch of at most this many tokens is written item by item: making numpy's views of
# llama.cpp's arrays costs more than a few ctypes writes (a step of one stream: 75 us against 12).
SMALL_BATCH = 32


def write(batch: Any, rows: list[tuple[int, list[int], int, int]]) -> int:
    """Writes rows of (sequence id, tokens, position of the first, index of the first that gives
    logits) into llama.cpp's batch, in order; the number of tokens in it. The draft model's
    batches (llamacpp/draft.py) are written here too."""
    n = sum(len(r[1]) for r in rows)
    (_write_items if n <= SMALL_BATCH else _write_arrays)(batch, rows, n)
    batch.n_tokens = n
    return n


def _write_items(batch: Any, rows: list[tuple[int, list[int], int, int]], n: int) -> None:
    token, pos, logits, n_seq_id, seq_id = batch.token, batch.pos, batch.logits, batch.n_seq_id, batch.seq_id
    i = 0
    for seq, tokens, at, from_ in rows:
        for k, t in enumerate(tokens):
            token[i], pos[i], logits[i], n_seq_id[i] = t, at + k, 1 if k >= from_ else 0, 1
            seq_id[i][0] = seq
            i += 1


def _write_arrays(batch: Any, rows: list[tuple[int, list[int], int, int]], n: int) -> None:
    token = np.ctypeslib.as_array(batch.token, shape=(n,))
    pos = np.ctypeslib.as_array(batch.pos, shape=(n,))
    logits = np.ctypeslib.as_array(batch.logits, shape=(n,))
    np.ctypeslib.as_array(batch.n_seq_id, shape=(n,))[:] = 1
    first = 0
    for seq, tokens, at, from_ in rows:
        count = len(tokens)
        token[first:first + count] = tokens
        pos[first:first + count] = np.arange(at, at + count)
        logits[first:first + count] = 0
        logits[first + from_:first + count] = 1
        for i in range(first, first + count):
            batch.seq_id[i][0] = seq
        first += count
