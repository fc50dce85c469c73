"""The moderation classifier behind /v1/moderations: a small local classifier for OpenAI's 13 moderation categories.

What it is: a nearest-prototype similarity classifier on all-MiniLM-L6-v2 sentence embeddings, not
a trained moderation model. Each category has a dozen or so prototype sentences (a description
and short examples, in prototypes.py); HARMLESS holds 56 more for everyday topics and harmless look-alikes
("kill the process", "to die for", sex education, medicine doses). A text's raw score for a
category is the mean cosine similarity to the category's two closest prototypes minus the mean
similarity to the two closest harmless ones. A category is flagged when its raw score reaches its
threshold and is not far below the text's strongest category (harmful texts sit close to several
related categories; only the nearest are named). ``category_scores`` are
``sigmoid(SLOPE * margin)``, so 0.5 is the flagging point, and ``flagged`` is any category.

What is scored: the whole text when it is short (up to 96 words), each sentence, and for sentences
longer than 16 words (or text without sentence punctuation) windows of 16 words overlapping by
half; a text scores the highest of its pieces, so one harmful sentence among thousands of harmless
ones is scored on its own. Nothing is merged or cut off: a request that needs more than
MAX_PIECES pieces scored is refused with a 400 naming 'input'.

Calibration: THRESHOLDS, SPREAD and SLOPE were fitted by ``calibrate()`` (offline tooling in
tests/moderations/calibration.py) on the labelled set in tests/moderations/labelled.py (258
harmless texts, many with risky words, and 184 harmful ones across the categories, all written for
this purpose by one author), for all-MiniLM-L6-v2 only; that is why this always runs on that model
(the embedding model of /v1/embeddings when it is the default, else its own copy). Each threshold
maximises recall - 8 x false-positive rate: precision first, since every one of the 13 categories
adds its own false alarms to ``flagged``.

Measured on a separate held-out set in tests/moderations/test_moderations.py (74 everyday texts: work,
health, fitness, gardening, parenting, cooking, software, history, news, medicine, sex education;
53 harmful ones across the categories), written after the classifier was settled and never used
to fit it: 2 of 74 everyday texts flagged (2.7%; 95% interval 0.7-9%), 42 of 53 harmful texts
flagged (79%; 67-88%), 41 of those 42 with one of their own categories. Strong: harassment (9 of
9), sexual (7 of 7), sexual/minors and graphic violence (3 of 3 each). Weak: weapons and poisons
(illicit/violent, 1 of 4), other crimes (6 of 10), stated suicide intent (1 of 3, and named as
self-harm/intent 0 of 3). The classifier before this calibration flagged 28 of the 74 everyday
texts (38%) and 51 of the 53 harmful ones. Text without sentence punctuation is harder: in a
synthetic check, a harmful sentence hidden among 8 unpunctuated everyday ones was found 72% of the
time, and 20% of unpunctuated 10-sentence everyday texts (rich in risky words) were flagged.

It catches plain statements and requests, and misses sarcasm, coded language, euphemism and
context that a trained moderation model would catch; the sets are small and from one author, so
the figures are rough. Use it as a first filter, not as a guarantee.
"""

from __future__ import annotations

import re

import anyio
import numpy as np

from ..core.errors import InvalidRequestError
from ..embeddings.batcher import Batcher
from .prototypes import HARMLESS, PROTOTYPES

# In the order of OpenAI's schema.
CATEGORIES = ("hate", "hate/threatening", "harassment", "harassment/threatening", "illicit", "illicit/violent",
              "self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "sexual/minors", "violence",
              "violence/graphic")
# A subcategory implies its parent, as in OpenAI's taxonomy.
PARENT = {"hate/threatening": "hate", "harassment/threatening": "harassment", "illicit/violent": "illicit",
          "self-harm/intent": "self-harm", "self-harm/instructions": "self-harm", "sexual/minors": "sexual",
          "violence/graphic": "violence"}


TOP = 2             # a category's similarity: the mean of its two closest prototypes
HARMLESS_TOP = 2    # the background: the mean of the two closest harmless prototypes

# Fitted by calibrate() (tests/moderations/calibration.py) on the labelled set of the tests
# (all-MiniLM-L6-v2).
THRESHOLDS: dict[str, float] = {
    "hate": 0.0755, "hate/threatening": 0.2108, "harassment": 0.0639, "harassment/threatening": 0.1373,
    "illicit": 0.1097, "illicit/violent": 0.17, "self-harm": 0.126, "self-harm/intent": 0.2145,
    "self-harm/instructions": 0.1535, "sexual": 0.1222, "sexual/minors": 0.149, "violence": 0.079,
    "violence/graphic": 0.2033,
}
SLOPE = 22.0
SPREAD = 0.08

# What is scored of a text: the whole text when it fits in one embedding (it carries the context its
# sentences share), and every sentence; a sentence longer than a window (or text without sentence
# punctuation) is read in windows overlapping by half, so any run of up to half a window lies whole
# inside one window. Nothing is merged: one harmful sentence among thousands is scored on its own.
WINDOW_WORDS = 16
WINDOW_CHARS = 160       # a window also stops at this many characters (long words, text without spaces)
WHOLE_WORDS = 96         # texts up to this long are also scored whole
WHOLE_CHARS = 600
MAX_PIECES = 16_384      # distinct pieces (sentences and windows) one request may need scored; more is a 400
INLINE_CHARS = 20_000    # requests with more text than this are split and scored on a worker thread
RENDER_INLINE = 16       # responses with more results than this are rendered on a worker thread
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])|\n+")


# --- what is scored (pure Python, shared by the service and by calibration) --------------------------

def _words(span: str) -> list[str]:
    """The words of a span, a word longer than a quarter window cut into pieces of that size."""
    size = WINDOW_CHARS // 4
    return [w[i:i + size] for w in span.split() for i in range(0, len(w), size)]


def windows(sentence: str) -> list[str]:
    """The sentence itself when it fits in a window, else windows of at most WINDOW_WORDS words and
    WINDOW_CHARS characters, each starting halfway through the one before."""
    words = _words(sentence)
    if len(words) <= WINDOW_WORDS and len(sentence) <= WINDOW_CHARS:
        return [sentence]
    out, start = [], 0
    while True:
        end, chars = start, -1
        while end < len(words) and end - start < WINDOW_WORDS and chars + 1 + len(words[end]) <= WINDOW_CHARS:
            chars += 1 + len(words[end])
            end += 1
        out.append(" ".join(words[start:end]))
        if end >= len(words):
            return out
        start += max(1, (end - start) // 2)


def segments(text: str) -> list[str]:
    """The pieces of one text that are scored (its score is the highest of theirs): the text itself
    if it is short, then its sentences, long ones as windows. Repeats are kept once."""
    parts = [p.strip() for p in _SENTENCE_END.split(text) if p and p.strip()]
    if not parts:
        return [text]
    pieces = [w for p in parts for w in windows(p)]
    if len(pieces) == 1 and pieces[0] == text.strip():
        return [text]
    whole = [text] if len(text) <= WHOLE_CHARS and len(text.split()) <= WHOLE_WORDS else []
    return list(dict.fromkeys(whole + pieces))


class Pieces:
    """The distinct pieces of a request's texts, and which of them belong to each text."""

    def __init__(self, texts: list[str]):
        index: dict[str, int] = {}
        self.rows: list[np.ndarray] = []
        for text in texts:
            self.rows.append(np.array([index.setdefault(s, len(index)) for s in segments(text)], dtype=np.int64))
            if len(index) > MAX_PIECES:
                # scoring only some of it would let what is not scored through: refuse instead
                raise InvalidRequestError(
                    f"'input' is too long to moderate in one request: it makes more than {MAX_PIECES} distinct "
                    f"pieces to score (sentences, and windows of up to {WINDOW_WORDS} words in longer ones; about "
                    f"130,000 words in all). Split it over several requests.", param="input")
        self.unique = list(index)


# --- scoring (pure numpy, shared by the service and by calibration) ---------------------------------

def _top_mean(sims: np.ndarray, k: int) -> np.ndarray:
    k = min(k, sims.shape[1])
    return np.sort(sims, axis=1)[:, -k:].mean(axis=1)


def raw_scores(vectors: np.ndarray, prototypes: dict[str, np.ndarray], harmless: np.ndarray) -> np.ndarray:
    """(N, 13) raw scores of unit vectors, in CATEGORIES order: how much closer each vector is to the
    category's nearest prototypes than to the nearest harmless ones."""
    background = _top_mean(vectors @ harmless.T, HARMLESS_TOP)
    return np.stack([_top_mean(vectors @ prototypes[c].T, TOP) - background for c in CATEGORIES], axis=1)


def margins(raw: np.ndarray, thresholds: dict[str, float] | None = None, spread: float | None = None) -> np.ndarray:
    """(N, 13) distances above the thresholds. A category more than ``spread`` below the strongest
    one of its text is pushed down by the excess: neighbouring categories (self-harm intent vs
    instructions, hate vs harassment) all sit close to a harmful text, and only the nearest
    ones should be flagged. The strongest category is never changed, so neither is ``flagged``."""
    thresholds = thresholds or THRESHOLDS
    spread = SPREAD if spread is None else spread
    m = raw - np.array([thresholds[c] for c in CATEGORIES])
    best = m.max(axis=1, keepdims=True)
    return m - np.maximum(0.0, best - spread - m)


def probabilities(raw: np.ndarray, thresholds: dict[str, float] | None = None, slope: float | None = None,
                  spread: float | None = None) -> np.ndarray:
    """(N, 13) category scores in [0, 1], 0.5 at the flagging point; a parent scores at least as
    high as its subcategories."""
    p = 1.0 / (1.0 + np.exp(-(slope or SLOPE) * margins(raw, thresholds, spread)))
    index = {c: i for i, c in enumerate(CATEGORIES)}
    for child, parent in PARENT.items():
        p[:, index[parent]] = np.maximum(p[:, index[parent]], p[:, index[child]])
    return p


def with_parents(labels: set[str] | frozenset[str] | tuple[str, ...]) -> set[str]:
    return set(labels) | {PARENT[c] for c in labels if c in PARENT}


# --- the classifier ----------------------------------------------------------------------------

class Classifier:
    def __init__(self, batcher: Batcher):
        self.batcher = batcher
        names = [(c, text) for c in CATEGORIES for text in PROTOTYPES[c]]
        vectors, _ = batcher.embed_blocking([text for _, text in names] + list(HARMLESS))
        self.prototypes = {c: vectors[[i for i, (name, _) in enumerate(names) if name == c]] for c in CATEGORIES}
        self.harmless = vectors[len(names):]

    async def raw(self, texts: list[str]) -> np.ndarray:
        """(N, 13) raw scores: the highest of each text's pieces."""
        big = sum(len(t) for t in texts) > INLINE_CHARS
        # long inputs take real time to split: off the event loop
        pieces = await anyio.to_thread.run_sync(Pieces, texts) if big else Pieces(texts)
        return await self.score(pieces, big)

    async def score(self, pieces: Pieces, big: bool = False) -> np.ndarray:
        vectors, _ = await self.batcher.embed(pieces.unique)
        if big:
            return await anyio.to_thread.run_sync(self._score, vectors, pieces)
        return self._score(vectors, pieces)

    def _score(self, vectors: np.ndarray, pieces: Pieces) -> np.ndarray:
        scores = raw_scores(vectors, self.prototypes, self.harmless)
        return np.stack([scores[rows].max(axis=0) for rows in pieces.rows])
