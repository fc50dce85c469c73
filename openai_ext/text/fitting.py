"""One way to fit a conversation to the model's context: leave out its oldest turns.

A family whose conversations outgrow the context (Responses with ``truncation: "auto"``, a long
Realtime session) gives the places where a kept history may begin (turn starts: the result must
not open on a tool's output without its call) and a way to prepare the prompt from one of them,
which raises ``ContextLengthExceeded`` when it does not fit. ``fit`` finds the oldest start that
fits by bisection, so a long history costs a few tries, not one per turn.

``slack`` cuts a little more than needed: a fraction of the turns the minimal cut keeps. A spoken
session cut at the minimum would have to cut again at its next turn, and every cut changes the
prompt's beginning, so the cached prompt is read again; with slack the next turns fit as they
are and share the kept beginning. Responses cuts at the minimum (slack 0), which keeps all it can.

Chat's own ``truncate_prompt`` setting (the web UI's) is another thing: it cuts tokens from the
start of one prompt inside ``chat.prepare``, for a client that asked for it, and a prompt cut so
never raises here. A family fits turns first; tokens are cut only where that setting is on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..core.errors import ContextLengthExceeded

T = TypeVar("T")


def fit(starts: Sequence[int], attempt: Callable[[int], T], *, slack: float = 0.0) -> T:
    """``attempt(start)`` for the oldest of ``starts`` (in order, oldest first) where it fits,
    then cut further by ``slack`` of the turns left. When even the newest start does not fit,
    its ``ContextLengthExceeded`` is raised (the first start's, with one start)."""
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
    more = int(slack * (len(starts) - hi))
    if more > 0:
        best = attempt(starts[min(len(starts) - 1, hi + more)])   # fewer turns than one that fits
    return best
