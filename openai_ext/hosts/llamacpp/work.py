"""What the batch scheduler runs for the embedded llama.cpp host: a generation (its own sampler
chain, seed, bias, grammar, log-probabilities, token budget) and a scoring pass (the prompt's
log-probabilities, for echo).

Both run on the scheduler's thread, step by step. A generation hands its pieces to the thread
that reads them through an outbox; while the reader is behind (a slow client), the sequence
sits out steps instead of running ahead, so memory stays bounded and the others go on.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

import numpy as np

from ..base import Piece, TokenLogprob
from ..request import GenerationSettings
from .context import Runtime
from .outbox import END, OUTBOX, Outbox
from .sampling import Constrained, Detokenizer, Options, greedy_alone, logit_biases, sampler_chain
from .speculate import ModelDraft, Pace
from .vision import Media

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
        self.slot: Any = None    # the scheduler's Slot it runs in, while it runs
        self.done = False
        self.order = 0
        self.passed = 0          # newcomers that started while it waited for room
        self.media: Media | None = None   # a vision prompt's images (their tokens are runs of negative ids)
        self.background = False  # a batch's line: sits out steps that read a live client's prompt (plan.py)

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

    def draft(self, limit: int, reach: bool = False) -> list[int]:
        """Up to ``limit`` tokens this generating sequence guesses come next, for the step to check
        beside its next token (llamacpp/speculate.py); none by default. ``reach``: the step cuts
        the draft to what pays (speculate.Pace.wanted)."""
        return []

    def chances(self, n: int) -> np.ndarray:
        """The chance that each of the first ``n`` tokens of its next draft is accepted
        (llamacpp/speculate.py)."""
        return np.zeros(n)

    def wants_draft(self) -> int:
        """Tokens this generating sequence wants the draft model to guess before the step (asked
        once a step); none by default."""
        return 0

    def probe(self) -> bool:
        """Whether a draft the step's costs would cut to nothing is checked a token deep this time
        (llamacpp/speculate.py: Pace.probe); never by default."""
        return False

    def produce(self, first: int, count: int, draft: list[int]) -> int:
        """The logits of this step's tokens are outputs first..first+count-1 (only the last one
        unless ``every_logit``), followed by one for each token of ``draft``, drafted after them.
        Returns how many drafted tokens it accepted (appended to ``tokens``, in order)."""
        return 0

    def fail(self, error: BaseException) -> None:
        self.done = True

    def restart(self) -> None:
        """It was preempted: its cells are gone, and all its tokens will be decoded again."""

    def retire(self) -> None:
        """Frees what it holds (samplers). Called once, on the scheduler's thread."""


class Generation(Work):
    def __init__(self, rt: Runtime, tokens: list[int], s: GenerationSettings, stop_event: threading.Event,
                 lookup: Pace | None = None):
        super().__init__(list(tokens))
        self.background = s.background
        self.lookup = lookup
        self.rt = rt
        self.max_new = s.max_new_tokens
        self.top = s.logprobs
        special = not Options.of(s).skip_special_tokens
        constrained = bool(s.grammar)
        # (under a grammar the bias is applied to the logits before it, see Constrained)
        biases = {} if constrained else logit_biases(s, rt.eog)
        self.sampler = sampler_chain(rt.L, rt.vocab, rt.n_vocab, rt.context_length, s, biases)
        self.argmax = not constrained and greedy_alone(rt.L, self.sampler)
        try:
            self.guide = Constrained(rt, s, self.sampler, special) if constrained else None
        except BaseException:
            rt.L.llama_sampler_free(self.sampler)
            raise
        self.text_of = Detokenizer(lambda t: rt.piece(t, special))
        if self.lookup is not None and self.guide is not None:
            # (a grammar's drafts are not checked yet: a sampled tool call was seen to run on
            # to its token budget with them, so a constrained generation goes one token a step)
            log.info("speculation is off for this request: its output follows a grammar")
            self.lookup = None
        self.stop_event = stop_event
        self.produced = 0
        self.forced: deque[int] = deque()   # tokens that replace one cut at a grammar trigger
        self.out = Outbox()
        self._halt = False
        self._cancelled = False

    # --- the reader's side --------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancelled = True

    # --- the scheduler's side -----------------------------------------------------------------
    def ready(self) -> bool:
        return self.out.qsize() < OUTBOX

    def halted(self) -> bool:
        return self._halt or self._cancelled or self.stop_event.is_set()

    def halt(self) -> None:
        self._halt = True

    def draft(self, limit: int, reach: bool = False) -> list[int]:
        budget = min(limit, self.max_new - self.produced - 1)
        if self.lookup is None or self.forced or budget <= 0 or self.halted():
            return []
        return self.lookup.draft(self.tokens, budget, reach)

    def chances(self, n: int) -> np.ndarray:
        return self.lookup.chances(n) if self.lookup is not None else np.zeros(n)

    def probe(self) -> bool:
        return self.lookup is not None and self.lookup.probe()

    def wants_draft(self) -> int:
        if not isinstance(self.lookup, ModelDraft) or self.forced or self.halted():
            return 0
        return max(0, min(self.lookup.wanted(), self.max_new - self.produced - 1))

    def produce(self, first: int, count: int, draft: list[int]) -> int:
        at = first + count - 1
        accepted = 0
        # Each drafted position is sampled as the next step would have sampled it: the draft is
        # kept while it is what the samplers chose (llamacpp/speculate.py).
        for i in range(len(draft) + 1):
            token = self._next(at + i)
            if token is None or self.done or self.forced or i == len(draft) or token != draft[i]:
                break
            accepted += 1
        if draft and self.lookup is not None:
            self.lookup.checked(len(draft), accepted)
        return accepted

    def _next(self, at: int) -> int | None:
        """Samples and sends the token after decoder output ``at``: the token, None when the
        generation ended instead."""
        if self.halted():   # checked between every two tokens, as the reader expects
            self.done = True
            return None
        if self.forced:
            forced = self.forced.popleft()
            self._emit(forced, "", at)
            return forced
        while True:
            if self.guide is not None:
                token = self.guide.sample(at)
            elif self.argmax:
                token = int(self.rt.logits(at).argmax())
            else:
                token = self.rt.L.llama_sampler_sample(self.sampler, self.rt.ctx, at)
            if token is None or self.rt.eog[token]:
                # (None: the grammar allows no token that the request did not ban)
                self.out.put(Piece(self.text_of.flush(), tokens=0, finish_reason="stop"))
                self.done = True
                return None
            text = self.text_of.push(token)
            tokens = [token]
            cut = self.guide.watch(token, text) if self.guide is not None else None
            if cut is not None:  # the trigger ended inside this token: it is replaced
                text, tokens = cut
                self.text_of.flush()
            if tokens:
                break
            # (nothing before the marker's end to replace it with: the grammar, now started,
            # chooses from the same logits)
        self._emit(tokens[0], text, at)
        self.forced.extend(tokens[1:])
        return tokens[0]

    def _emit(self, token: int, text: str, at: int) -> None:
        lp = self.rt.logprob(at, token, self.top) if self.top is not None else None
        self.produced += 1
        if self.produced >= self.max_new:
            self.out.put(Piece(text + self.text_of.flush(), logprob=lp, finish_reason="length"))
            self.done = True
            return
        self.out.put(Piece(text, logprob=lp))
        self.tokens.append(token)

    def fail(self, error: BaseException) -> None:
        self.done = True
        self.out.put(error)

    def retire(self) -> None:
        self.out.put(END)
        if self.lookup is not None:
            self.lookup.finished(self.produced)
        self.rt.L.llama_sampler_free(self.sampler)
        if self.media is not None:
            self.media.close()
        if self.guide is not None:
            self.guide.close()


class _Answered(Work):
    """A pass whose caller waits for its answer (``wait``) on another thread, where a failure is
    raised."""

    def __init__(self, tokens: list[int]):
        super().__init__(tokens)
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done = True

    def retire(self) -> None:
        self.finished.set()

    def wait(self) -> None:
        self.finished.wait()
        if self.error is not None:
            raise self.error


class Scoring(_Answered):
    """Log-probabilities of every token of ``tokens`` after the first, each given the ones before."""

    every_logit = True
    reuse = False

    def __init__(self, rt: Runtime, tokens: list[int], top: int):
        super().__init__(list(tokens))
        self.rt, self.top = rt, top
        self.scores: list[TokenLogprob] = []

    def end(self) -> int:
        return len(self.tokens) - 1   # the last token predicts nothing that is asked for

    def produce(self, first: int, count: int, draft: list[int]) -> int:
        start = self.n_past - count
        del self.scores[start:]   # (read again after a preemption)
        for i in range(count):
            self.scores.append(self.rt.logprob(first + i, self.tokens[start + i + 1], self.top))
        if self.n_past >= self.end():
            self.done = True
        return 0


class NextToken(_Answered):
    """The model's own distribution of the token after ``tokens`` (no sampler touches it): the
    top ``top`` token ids with their probabilities, for /v1/internal/logits."""

    def __init__(self, rt: Runtime, tokens: list[int], top: int):
        super().__init__(list(tokens))
        self.rt, self.top = rt, top
        self.best: list[tuple[int, float]] = []

    def produce(self, first: int, count: int, draft: list[int]) -> int:
        logits = self.rt.logits(first + count - 1)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        self.best = [(int(t), float(probs[t])) for t in np.argsort(-probs)[:self.top]]
        self.done = True
        return 0
