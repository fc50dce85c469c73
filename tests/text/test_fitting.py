"""text/fitting.py: the oldest turns left out until a conversation fits, found by bisection."""

from __future__ import annotations

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
    (9, 1, 0.25, 3),    # 8 turns left after the minimal cut: a quarter more (2) goes
    (9, 8, 0.25, 8),    # one turn left: nothing more to cut
    (9, 4, 0.0, 4),
])
def test_slack_cuts_a_share_more_so_the_next_turns_fit_as_they_are(turns, first_fitting, slack, expected):
    assert fit(list(range(turns)), fits_from(first_fitting, []), slack=slack) == expected


def test_when_nothing_fits_the_newest_starts_error_is_raised():
    with pytest.raises(ContextLengthExceeded, match="start 3 does not fit"):
        fit([0, 1, 2, 3], fits_from(9, []))
    with pytest.raises(ContextLengthExceeded, match="start 0 does not fit"):
        fit([0], fits_from(9, []))
