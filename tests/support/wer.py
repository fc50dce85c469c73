"""Word error rate: how far a transcript is from the text that was spoken."""

from __future__ import annotations

import re


def words(text: str) -> list[str]:
    """Lower-case words; punctuation and hyphens do not count ("sea-shells" is two words)."""
    return re.sub(r"[^\w\s']", " ", text.lower().replace("-", " ")).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's length."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))
