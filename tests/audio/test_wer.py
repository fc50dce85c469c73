"""The word error rate that the speech and transcription tests score with."""

import pytest
from support.wer import word_error_rate


def test_word_error_rate():
    assert word_error_rate("the cat sat", "The cat, sat.") == 0
    assert word_error_rate("the cat sat on the mat", "the cat sat on mat") == pytest.approx(1 / 6)
    assert word_error_rate("the cat sat", "a cat sat down") == pytest.approx(2 / 3)
    assert word_error_rate("a b", "c d e") == 1.5
    assert word_error_rate("sea-shells don't", "sea shells don't") == 0
