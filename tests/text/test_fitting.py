"""text/fitting.py: the oldest turns left out until a conversation fits, found by bisection."""

from __future__ import annotations

import itertools
import math

import pytest

from openai_ext.core.errors import ContextLengthExceeded
from openai_ext.text.fitting import fit


def fits_from(first_fitting: int, tried: list[int]):
    """An attempt that fits from start ``first_fitting`` on (a context that holds that many fewer turns)."""
    def attempt(start: int) -> int:
        tried.append(start)
        if start < first_fitting:
            raise ContextLengthExceeded(f"start {start} does not fit", param="messages")
        return start
    return attempt


@pytest.mark.parametrize("turns, first_fitting", [(1, 0), (2, 1), (10, 0), (10, 3), (10, 9), (100, 37), (1000, 999)])
def test_the_oldest_start_that_fits_in_a_few_tries(turns, first_fitting):
    starts = list(range(turns))
    tried: list[int] = []
    assert fit(starts, fits_from(first_fitting, tried)) == first_fitting
    # the whole conversation, the newest start, then a bisection: never one try per turn
    assert len(tried) <= 2 + math.ceil(math.log2(max(turns, 2))), tried


def test_starts_are_the_places_a_history_may_begin():
    tried: list[int] = []
    assert fit([0, 2, 5, 9], fits_from(3, tried)) == 5   # not 3: no start there
    assert all(t in (0, 2, 5, 9) for t in tried)


@pytest.mark.parametrize("turns, first_fitting, slack, expected", [
    (9, 0, 0.25, 0),    # it fits whole: nothing is cut, slack or not
    (9, 1, 0.25, 2),    # 8 turns left after the minimal cut: up to a quarter more (2), rounded to a step of 2
    (9, 3, 0.25, 3),    # 6 left: a quarter is 1.5, a step of 1: nothing more
    (21, 1, 0.25, 4),   # 20 left: a quarter is 5, a step of 4: cut at 4
    (21, 4, 0.25, 4),   # the minimal cut on a step already: nothing more
    (9, 8, 0.25, 8),    # one turn left: nothing more to cut
    (9, 4, 0.0, 4),
])
def test_slack_cuts_up_to_a_share_more_at_a_step(turns, first_fitting, slack, expected):
    assert fit(list(range(turns)), fits_from(first_fitting, []), slack=slack) == expected


def test_with_slack_a_growing_conversation_keeps_its_cut_for_several_turns():
    """Fitted again at every turn from the whole conversation (as Realtime is), the cut stays where
    it is for a step of turns, so the prompt's beginning (and the cache of it) stays; the minimal
    cut would move at every turn."""
    room = 20   # turns the context holds
    growing = range(room + 1, room + 41)
    cuts = [fit(list(range(turns)), fits_from(turns - room, []), slack=0.25) for turns in growing]
    assert all(turns - room <= cut < turns - room * 0.75 + 1 for cut, turns in zip(cuts, growing, strict=True))
    moves = sum(a != b for a, b in itertools.pairwise(cuts))
    assert moves <= 40 // 4, cuts


def test_a_slack_cut_that_does_not_fit_keeps_the_minimal_one():
    def attempt(start: int) -> int:
        if start < 5 or start == 8:   # the slack cut (a prompt need not shrink with every turn left out)
            raise ContextLengthExceeded("no", param="messages")
        return start
    assert fit(list(range(24)), attempt, slack=0.25) == 5


def test_when_nothing_fits_the_newest_starts_error_is_raised():
    with pytest.raises(ContextLengthExceeded, match="start 3 does not fit"):
        fit([0, 1, 2, 3], fits_from(9, []))
    with pytest.raises(ContextLengthExceeded, match="start 0 does not fit"):
        fit([0], fits_from(9, []))
