"""Speculative decoding for the embedded host: prompt lookup, or a draft model.

A generating sequence proposes the tokens that followed the last place its own context (prompt
and output so far) held the same last few tokens: an agent that quotes a file it edits, or a
model that repeats a name, goes on as it went before. The batch decodes the proposal together with
the sequence's next token in one step, and the sequence samples at each drafted position in turn,
exactly as it would have sampled one step at a time, accepting drafted tokens while they are what
it sampled (llamacpp/work.py). So the output is the one it would have been without the draft (the
same tokens where greedy, the same distribution where sampled: every token is still drawn from the
model's own distribution given the tokens before it), and a draft only saves steps. llama.cpp's
server checks its drafts the same way.

With a draft model (the ``draft_model`` setting, llamacpp/draft.py), a smaller model of the same
vocabulary proposes instead: it guesses where the sequence has never been, at the price of its own
steps. Its drafts are checked the same way.

A draft costs a step some time where it is wrong, so a sequence whose drafts miss drafts less
often: after a draft of which nothing was accepted it skips the next one, then two, four, up to
``MAX_SKIP``; any accepted token ends the pause.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

# Tokens that must match for a proposal, longest first: three keeps chance matches in prose rare.
NGRAMS = (12, 6, 3)
START = 4
MAX_SKIP = 16
# One draft in this many that its costs cut to nothing is checked a token deep all the same.
PROBE_EVERY = 4


class Tally:
    """What speculation did for the last generations (the model info shows it)."""

    def __init__(self, keep: int = 16):
        self._recent: deque[dict[str, int]] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, tokens: int, drafted: int, accepted: int) -> None:
        with self._lock:
            self._recent.append({"tokens": tokens, "drafted": drafted, "accepted": accepted})

    def recent(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._recent)


class Pace:
    """One sequence's speculation: how long its next draft may be, when it pauses, and what came of
    its drafts (for the tally)."""

    # Most tokens a draft holds where the draft_max setting does not say (each kind's own).
    MOST = 16

    def __init__(self, most: int | None, tally: Tally | None = None):
        self.most, self.tally = most or self.MOST, tally
        self._skip = 0                                   # drafts to pass over after misses
        self._pause = 0
        self._length = min(START, self.most)             # tokens the next draft may hold
        self.drafted = 0
        self.accepted = 0
        # drafts checked and those whose first token was accepted; tokens checked after an accepted
        # one and those accepted (see chances)
        self._firsts, self._first_hits = 0, 0
        self._nexts, self._next_hits = 0, 0
        self._unchecked = 0                              # drafts cut to nothing since the last probe

    def wanted(self, reach: bool = False) -> int:
        """Tokens the next draft may hold; 0 while it pauses (each call passes one draft over).
        ``reach``: the step's pays-check cuts the draft (llamacpp/plan.paying), which weighs each
        drafted token's chance against its cost; the draft may then hold ``most`` tokens. A
        rewrite on two cores (where a step of 64 tokens costs less than one of 40) gave 47.0
        tokens/s this way against 45.7 with the length rule's drafts (servers taking turns,
        four rounds)."""
        if self._pause:
            self._pause -= 1
            return 0
        return self.most if reach else self._length

    def chances(self, n: int) -> np.ndarray:
        """The chance that each of the first ``n`` tokens of the next draft is accepted: that its
        first is, and each after it given the one before was. Where a draft misses it mostly
        misses at once (prompt lookup found the wrong place: in a file of near-repeated lines, a
        line like several), and once a place is right the copy runs on: a file being rewritten had
        its first drafted token accepted about 87 times in 100 and the ones after it about 98,
        where one rate for all (82 in 100) to the i-th power cut its drafts to two tokens. Both
        start at three in four: only a draft that pays is checked (llamacpp/plan.paying), and on a
        CPU where a drafted token costs half a step, a start of one in two would check no first
        draft (see ``probe``)."""
        first = (self._first_hits + 3) / (self._firsts + 4)
        after = (self._next_hits + 3) / (self._nexts + 4)
        return first * after ** np.arange(n)

    def probe(self) -> bool:
        """Whether a draft its costs cut to nothing (llamacpp/plan.paying) is checked a token deep
        this time: one in ``PROBE_EVERY``. Both things that decide a draft are learnt from drafts
        checked: the sequence's rate, and what a step's drafted token costs (a step of one token
        a time tells the step's cost fit nothing about a second token, which costs far less on a
        CPU than the step itself). Cut to nothing for good, a sequence that got off to a bad start
        would never draft again: a file being rewritten, whose drafts are accepted nine times in
        ten, drafted 0.3 tokens a step."""
        self._unchecked += 1
        if self._unchecked < PROBE_EVERY:
            return False
        self._unchecked = 0
        return True

    def checked(self, drafted: int, accepted: int) -> None:
        """What came of the last draft."""
        self.drafted += drafted
        self.accepted += accepted
        if drafted:
            self._firsts += 1
            self._first_hits += accepted > 0
            self._nexts += max(0, min(accepted + 1, drafted) - 1)
            self._next_hits += max(0, accepted - 1)
        # the next draft as long as this one's accepted run and one more, twice as long when all of
        # it was accepted; a draft whose first token missed found the wrong place, which says
        # nothing of how long the right place's run is, so the length stays
        if accepted == drafted:
            self._length = min(self.most, drafted * 2)
        elif accepted:
            self._length = min(self.most, accepted + 1)
        if accepted:
            self._skip = 0
        else:
            self._skip = min(max(1, self._skip * 2), MAX_SKIP)
            self._pause = self._skip

    def finished(self, tokens: int) -> None:
        """The generation ended after ``tokens`` tokens."""
        if self.tally is not None:
            self.tally.add(tokens, self.drafted, self.accepted)

    def draft(self, tokens: list[int], limit: int, reach: bool = False) -> list[int]:
        """Up to ``limit`` tokens that may follow ``tokens``; none when it has no guess.
        ``reach``: as in ``wanted``."""
        raise NotImplementedError


class PromptLookup(Pace):
    """Drafts for one sequence from its own tokens. Keeps an index of every run of ``NGRAMS``
    tokens to where it last stood, extended as the sequence grows, so a draft costs the new tokens
    only. The longest run that matches wins: in a file of near-repeated lines (code), the last
    three tokens stood last in the line just written, while a longer run finds the line being
    copied."""

    # Its drafts cost nothing to make, and a longer step spreads its fixed cost wider (a 300-line
    # rewrite on a 2-core CPU, hosts taking turns in one process: 42.3 tokens/s at 16, 43.8 at 32,
    # 45.0 at 48); 63 drafted tokens and the sequence's own make a step of plan.TILED tokens, which
    # llama.cpp's flash attention on the CPU reads far faster than one of 63. The pays-check still
    # cuts a draft that does not pay.
    MOST = 63

    def __init__(self, most: int | None, tally: Tally | None = None):
        super().__init__(most, tally)
        # n-gram -> index of the token after its last place, for each length
        self._where: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAMS}
        self._seen = 0                                   # tokens whose n-grams are indexed
        self._behind: int | None = None                  # how far back the place last drafted from lies

    def draft(self, tokens: list[int], limit: int, reach: bool = False) -> list[int]:
        n = len(tokens)
        # index the n-grams that have a token after them (the last n-gram has none yet)
        for size, where in self._where.items():
            for i in range(max(self._seen, size), n):
                gram = tuple(tokens[i - size:i])
                if gram[-1] >= 0:   # (an image's tokens are negative ids: no text to repeat)
                    where[gram] = i
        self._seen = n
        length = self.wanted(reach)
        if not length:
            return []
        at = self._following(tokens)
        if at is None:
            at = next((a for size, where in self._where.items() if n > size
                       and (a := where.get(tuple(tokens[n - size:]))) is not None), None)
        if at is None:
            return []
        self._behind = n - at
        draft = tokens[at:at + min(limit, length)]
        for i, t in enumerate(draft):
            if t < 0:
                return draft[:i]
        return draft

    def _following(self, tokens: list[int]) -> int | None:
        """Where the place the last draft came from goes on, while what was written since matches
        it: a copy keeps to its source. The index knows each n-gram's last place only, and in a
        file being rewritten that is soon the copy just written, whose next line is another one
        (a 300-line file rewritten by Qwen2.5-Coder-0.5B: 955 of 959 drafted tokens accepted with the
        source kept, 850 of 1,294 without)."""
        if self._behind is None:
            return None
        n, at = len(tokens), len(tokens) - self._behind
        keep = NGRAMS[-1]
        if at < keep or at >= n or tokens[at - keep:at] != tokens[n - keep:]:
            return None
        return at


class ModelDraft(Pace):
    """Drafts for one sequence from a draft model (llamacpp/draft.py), which the scheduler runs
    for every drafting sequence together before the step and leaves here as ``proposal``."""

    # Each drafted token costs the draft model a step (it stops where it is unsure).
    MOST = 16

    def __init__(self, most: int | None, tally: Tally | None = None):
        super().__init__(most, tally)
        self.proposal: list[int] = []

    def draft(self, tokens: list[int], limit: int, reach: bool = False) -> list[int]:
        # (the draft model made it before the step, to the length rule's length: each of its
        # tokens cost the draft model a step, so it is never longer)
        proposal, self.proposal = self.proposal, []
        return proposal[:limit]
