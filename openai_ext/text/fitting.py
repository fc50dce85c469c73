"""One way to fit a conversation to the model's context: leave out its oldest turns.

A family whose conversations outgrow the context (Responses with ``truncation: "auto"``, a long
Realtime session) gives the places where a kept history may begin (turn starts: the result must
not open on a tool's output without its call) and a way to prepare the prompt from one of them,
which raises ``ContextLengthExceeded`` when it does not fit. ``fit`` finds the oldest start that
fits by bisection, so a long history costs a few tries, not one per turn.

``slack`` cuts a little more than needed, up to that fraction of the turns the minimal cut keeps.
A spoken session is fitted again from its whole conversation at every turn; cut at the minimum,
its cut would move on by a turn each time, and every move changes the prompt's beginning, so the
cached prompt is read again. So the cut is rounded up to a multiple of a step (a power of two,
at most ``slack`` of the turns kept): the next turns find the same cut, and share the kept
beginning, until the minimum passes it. Responses cuts at the minimum (slack 0), which keeps all
it can.

Chat's own ``truncate_prompt`` setting (the web UI's) is the third way, and the last resort: it
cuts tokens from the start of one prompt inside ``chat.prepare`` (the instructions and the
template's beginning go first), and a prompt cut so never raises. Chat Completions, the legacy
completions and Messages send their prompt as it is, so there it is the only way, where the
setting is on. Responses and Realtime fit turns here first, their attempts with tokens never cut:
a response's input is never cut by tokens (its ``truncation`` says what to do instead of the
setting; compaction's summary passes are cut, compaction.py), and Realtime cuts the newest turn's
tokens only where even that turn alone does not fit and the setting is on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..core.errors import ContextLengthExceeded

T = TypeVar("T")


def fit(starts: Sequence[int], attempt: Callable[[int], T], *, slack: float = 0.0) -> T:
    """``attempt(start)`` for the oldest of ``starts`` (in order, oldest first) where it fits,
    then cut further by up to ``slack`` of the turns left (see the module's docstring). When
    even the newest start does not fit, its ``ContextLengthExceeded`` is raised (the first
    start's, with one start)."""
    try:
        return attempt(starts[0])
    except ContextLengthExceeded:
        if len(starts) == 1:
            raise
    lo, hi = 1, len(starts) - 1
    best = attempt(starts[hi])   # the newest must fit at all; then starts[hi] always fits
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            best, hi = attempt(starts[mid]), mid
        except ContextLengthExceeded:
            lo = mid + 1
    cut = _rounded(hi, slack * (len(starts) - hi), len(starts) - 1)
    if cut > hi:
        with contextlib.suppress(ContextLengthExceeded):   # (fewer turns than one that fits)
            best = attempt(starts[cut])
    return best


def _rounded(cut: int, most: float, last: int) -> int:
    """``cut`` rounded up to a multiple of the largest power of two that is at most ``most``
    (where that is under one, ``cut`` itself), and not past ``last``."""
    if most < 1:
        return cut
    step = 1 << (int(most).bit_length() - 1)
    return min(last, -(-cut // step) * step)
