"""POST /v1/moderations: a small local classifier for OpenAI's 13 moderation categories.

How it works: each category has a handful of prototype sentences (a description and a few short
examples, below). A text is embedded with all-MiniLM-L6-v2; its raw score for a category is the
mean cosine similarity to the two closest prototypes of that category, minus half the similarity
to the closest harmless prototype (this keeps "kill the process" or "to die for" down). Long
texts are also scored sentence by sentence and the highest score counts, so one bad sentence in
a long harmless text still shows. A category is flagged when its raw score reaches its threshold
and is not far below the text's strongest category (harmful texts sit close to several related
categories; only the nearest are named). ``category_scores`` are
``sigmoid(SLOPE * margin)``, so 0.5 is the flagging point, and ``flagged`` is any category.

The thresholds, SPREAD and SLOPE were fitted by ``calibrate()`` on the labelled set in
tests/test_moderations.py, for all-MiniLM-L6-v2 only. That is why this always runs on that model
(the embedding model of /v1/embeddings when it is the default, else its own copy). It is a
similarity classifier on a small model: it catches plain statements, and misses sarcasm, coded
language and context that a trained moderation model would catch.
"""

from __future__ import annotations

import functools
import re
import uuid
from typing import Any

import anyio
import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from .embeddings import MAX_INPUTS, embedder
from .engines import Lazy
from .engines.embedding import DEFAULT_MODEL_ID, Batcher, configured_model_id, load_batcher
from .errors import InvalidRequestError
from .models import card
from .state import ApiState

router = APIRouter()

MODEL_ID = f"{DEFAULT_MODEL_ID}-moderation"
ENGINE_KEY = "moderations"

# In the order of OpenAI's schema.
CATEGORIES = ("hate", "hate/threatening", "harassment", "harassment/threatening", "illicit", "illicit/violent",
              "self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "sexual/minors", "violence",
              "violence/graphic")
# A subcategory implies its parent, as in OpenAI's taxonomy.
PARENT = {"hate/threatening": "hate", "harassment/threatening": "harassment", "illicit/violent": "illicit",
          "self-harm/intent": "self-harm", "self-harm/instructions": "self-harm", "sexual/minors": "sexual",
          "violence/graphic": "violence"}

PROTOTYPES: dict[str, tuple[str, ...]] = {
    "hate": (
        "hateful speech that attacks people because of their race, religion, ethnicity, gender or sexuality",
        "people of that race are inferior subhuman vermin",
        "immigrants and foreigners are dirty and ruin our country",
        "I hate gays, they are sick and disgusting",
        "that religion is evil and all its followers are scum",
        "women are dumb and belong in the kitchen",
    ),
    "hate/threatening": (
        "calls to kill or hurt a whole group of people because of their race, religion or sexuality",
        "we must exterminate all of them, that race should be wiped out",
        "they should all be shot, every last one of those people",
        "burn their mosques and synagogues to the ground",
    ),
    "harassment": (
        "insulting, bullying or demeaning a person directly",
        "you are a stupid worthless idiot",
        "shut up loser, everyone hates you",
        "you are ugly and pathetic, nobody likes you",
    ),
    "harassment/threatening": (
        "threatening to hurt or kill the person you are talking to",
        "I will find you and hurt you",
        "I know where you live, you are going to pay",
        "I am going to beat you up and kill you",
    ),
    "illicit": (
        "asking how to commit a crime such as stealing, fraud, hacking or making drugs",
        "how to steal from a shop without getting caught",
        "how to hack into someone's account",
        "where to buy illegal drugs and counterfeit money",
        "how to commit fraud and avoid the police",
    ),
    "illicit/violent": (
        "asking how to make weapons, explosives or poison to hurt people",
        "how to build a bomb",
        "how to buy an illegal gun",
        "how to poison someone secretly",
    ),
    "self-harm": (
        "hurting yourself on purpose, cutting, suicide or eating disorders",
        "I cut myself when I feel bad",
        "I want to die, life is not worth living",
        "I starve myself and make myself vomit",
    ),
    "self-harm/intent": (
        "saying that you are going to kill yourself soon",
        "I am going to commit suicide",
        "tonight I will end my life",
    ),
    "self-harm/instructions": (
        "asking for methods or instructions to commit suicide or self-harm",
        "what is the easiest way to kill myself",
        "how to cut yourself without anyone noticing",
        "how many pills are a lethal overdose",
    ),
    "sexual": (
        "explicit sexual content or pornography",
        "we had sex, naked bodies in bed",
        "erotic story with explicit sex",
        "send nude photos, porn",
    ),
    "sexual/minors": (
        "sexual content involving children or minors under eighteen",
        "sexual pictures of a child",
        "an erotic story about an underage teenager",
    ),
    "violence": (
        "violence: attacking, killing, shooting, stabbing or beating people",
        "he shot and killed them",
        "I am going to stab him",
        "they beat him up badly",
    ),
    "violence/graphic": (
        "graphic gore with blood, wounds and mutilated bodies",
        "blood and guts everywhere, the body was torn apart",
        "his flesh was ripped open and bones were crushed",
    ),
}

# Harmless texts that share words with harmful ones.
HARMLESS: tuple[str, ...] = (
    "an everyday question about cooking, travel, work or the weather",
    "a friendly conversation between colleagues",
    "a question about programming and computers",
    "a news report about politics and the economy",
    "a history lesson about a war",
    "health advice from a doctor",
    "a school lesson on biology and sex education",
    "a review of a crime thriller movie",
    "I am tired and stressed after a long day",
    "kill the process and restart the server",
    "this dessert is to die for",
    "the team crushed their rivals in the match",
)
HARMLESS_WEIGHT = 0.5

# Fitted by calibrate() on tests/test_moderations.py's labelled set (all-MiniLM-L6-v2).
THRESHOLDS: dict[str, float] = {
    "hate": 0.1197, "hate/threatening": 0.1853, "harassment": 0.0922, "harassment/threatening": 0.2008,
    "illicit": 0.0961, "illicit/violent": 0.1887, "self-harm": 0.0691, "self-harm/intent": 0.1645,
    "self-harm/instructions": 0.1353, "sexual": 0.1573, "sexual/minors": 0.2423, "violence": 0.114,
    "violence/graphic": 0.2518,
}
SLOPE = 18.0
SPREAD = 0.04

MAX_SEGMENTS = 256     # sentences scored per input besides the whole text; more are scored in groups
INLINE_CHARS = 20_000  # requests with more text than this are split and scored on a worker thread
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


# --- scoring (pure numpy, shared by the route and by calibration) ---------------------------------

def segments(text: str) -> list[str]:
    """The whole text, then its sentences (grouped so there are at most MAX_SEGMENTS)."""
    parts = [p.strip() for p in _SENTENCE_END.split(text) if p and p.strip()]
    if len(parts) <= 1:
        return [text]
    if len(parts) > MAX_SEGMENTS:
        size = -(-len(parts) // MAX_SEGMENTS)
        parts = [" ".join(parts[i:i + size]) for i in range(0, len(parts), size)]
    return [text, *parts]


def raw_scores(vectors: np.ndarray, prototypes: dict[str, np.ndarray], harmless: np.ndarray) -> np.ndarray:
    """(N, 13) raw scores of unit vectors, in CATEGORIES order."""
    background = HARMLESS_WEIGHT * (vectors @ harmless.T).max(axis=1)
    columns = []
    for category in CATEGORIES:
        sims = vectors @ prototypes[category].T
        top = np.sort(sims, axis=1)[:, -2:] if sims.shape[1] >= 2 else sims
        columns.append(top.mean(axis=1) - background)
    return np.stack(columns, axis=1)


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


def fit_threshold(raw: np.ndarray, positive: np.ndarray) -> float:
    """The cut between two neighbouring scores that maximises balanced accuracy (recall on the
    category and on everything else weigh the same, as the categories are small)."""
    values = np.unique(raw)
    if not positive.any() or positive.all() or len(values) < 2:
        return float(values.max() + 1) if not positive.any() else float(values.min())
    best, cut = -1.0, float(values[0])
    for a, b in zip(values[:-1], values[1:]):
        t = (a + b) / 2
        flagged = raw >= t
        score = (flagged[positive].mean() + (~flagged[~positive]).mean()) / 2
        if score > best + 1e-12:
            best, cut = score, float(t)
    return cut


def calibrate(raw: np.ndarray, labels: list[set[str]]) -> tuple[dict[str, float], float, float]:
    """(thresholds, slope, spread) from raw scores (N, 13) and label sets (the most specific
    categories; parents are implied). Thresholds first, one per category; then the spread that
    gives the best category labels (F1 over all labels); then the slope that makes the scores
    the most likely probabilities."""
    labels = [with_parents(lab) for lab in labels]
    y = np.array([[c in lab for c in CATEGORIES] for lab in labels])
    thresholds = {c: round(fit_threshold(raw[:, i], y[:, i]), 4) for i, c in enumerate(CATEGORIES)}

    def label_f1(spread: float) -> float:
        on = probabilities(raw, thresholds, 1.0, spread) >= 0.5
        hits = (on & y).sum()
        return 2 * hits / max(1, on.sum() + y.sum())

    spread = float(max(np.round(np.arange(0.0, 0.301, 0.01), 2), key=lambda s: (label_f1(s), s)))

    def log_likelihood(k: float) -> float:
        p = np.clip(probabilities(raw, thresholds, k, spread), 1e-6, 1 - 1e-6)
        return float((y * np.log(p) + (1 - y) * np.log(1 - p)).sum())

    slope = float(max(np.arange(2.0, 101.0, 1.0), key=log_likelihood))
    return thresholds, slope, spread


# --- the classifier ----------------------------------------------------------------------------

class Classifier:
    def __init__(self, batcher: Batcher):
        self.batcher = batcher
        names = [(c, text) for c in CATEGORIES for text in PROTOTYPES[c]]
        vectors, _ = batcher.embed_blocking([text for _, text in names] + list(HARMLESS))
        self.prototypes = {c: vectors[[i for i, (name, _) in enumerate(names) if name == c]] for c in CATEGORIES}
        self.harmless = vectors[len(names):]

    async def raw(self, texts: list[str]) -> np.ndarray:
        """(N, 13) raw scores: the highest of each text's segments."""
        big = sum(len(t) for t in texts) > INLINE_CHARS
        # long inputs take real time to split and score: off the event loop
        pieces = await anyio.to_thread.run_sync(_split, texts) if big else _split(texts)
        unique = list(dict.fromkeys(s for p in pieces for s in p))   # repeated sentences are embedded once
        vectors, _ = await self.batcher.embed(unique)
        if big:
            return await anyio.to_thread.run_sync(self._score, vectors, unique, pieces)
        return self._score(vectors, unique, pieces)

    def _score(self, vectors: np.ndarray, unique: list[str], pieces: list[list[str]]) -> np.ndarray:
        scores = raw_scores(vectors, self.prototypes, self.harmless)
        row = {text: i for i, text in enumerate(unique)}
        return np.stack([scores[[row[s] for s in p]].max(axis=0) for p in pieces])


def _split(texts: list[str]) -> list[list[str]]:
    return [segments(t) for t in texts]


def _load_classifier(state: ApiState) -> Classifier:
    settings = state.settings
    if settings.embedding_engine == "sentence-transformers" and configured_model_id(settings) == DEFAULT_MODEL_ID:
        batcher = embedder(state).get_blocking()       # share the embedding model and its batches
    else:
        # the calibration holds for all-MiniLM-L6-v2 only: another embedding model gets its own copy
        batcher = load_batcher(settings.model_copy(update={"embedding_model": "",
                                                           "embedding_engine": "sentence-transformers"}))
    return Classifier(batcher)


def classifier(state: ApiState) -> Lazy[Classifier]:
    lazy = state.engines.get(ENGINE_KEY)
    if lazy is None:
        lazy = state.engines.setdefault(ENGINE_KEY, Lazy(functools.partial(_load_classifier, state), ENGINE_KEY))
    return lazy


def model_cards(state: ApiState) -> list[dict[str, Any]]:
    import importlib.util

    if importlib.util.find_spec("sentence_transformers") is None:
        return []
    return [card(MODEL_ID, state.started, "local")]


# --- the route ---------------------------------------------------------------------------------

class ModerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: Any
    model: str | None = None     # any name is served by this classifier


def parse_input(value: Any) -> list[str]:
    """A string, a list of strings (one result each), or a list of text parts (one result for all)."""
    shapes = "a string, a list of strings, or a list of {\"type\": \"text\", \"text\": ...} objects"
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequestError(f"'input' must be {shapes}.", param="input")
    if not value:
        raise InvalidRequestError("'input' cannot be an empty list. Send at least one text.", param="input")
    if len(value) > MAX_INPUTS:
        raise InvalidRequestError(f"'input' has {len(value)} items; at most {MAX_INPUTS} are allowed in one request. "
                                  "Split it over several requests.", param="input")
    if all(isinstance(x, str) for x in value):
        return list(value)
    if all(isinstance(x, dict) for x in value):
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type")
            if kind == "image_url":
                raise InvalidRequestError(
                    f"'input[{i}]' is an image: this local moderation model classifies text only. Send the text parts.",
                    param=f"input[{i}]")
            if kind != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequestError(f"'input[{i}]' must be {{\"type\": \"text\", \"text\": \"...\"}}.",
                                          param=f"input[{i}]")
            texts.append(part["text"])
        # multi-modal parts form one input, as at OpenAI: one result for all of them
        return ["\n".join(texts)]
    raise InvalidRequestError(f"'input' must be {shapes}; do not mix kinds in one list.", param="input")


def result(scores: np.ndarray, text: str) -> dict[str, Any]:
    if not text.strip():
        scores = np.zeros_like(scores)   # nothing to classify
    flags = {c: bool(s >= 0.5) for c, s in zip(CATEGORIES, scores)}
    return {"flagged": any(flags.values()), "categories": flags,
            "category_scores": {c: round(float(s), 6) for c, s in zip(CATEGORIES, scores)},
            "category_applied_input_types": {c: ["text"] for c in CATEGORIES}}


@router.post("/moderations")
async def create_moderation(body: ModerationRequest, request: Request):
    from .app import until_disconnect

    state: ApiState = request.app.state.api
    texts = parse_input(body.input)
    model = await classifier(state).get()

    async def work() -> dict[str, Any]:
        scores = probabilities(await model.raw(texts))
        return {"id": f"modr-{uuid.uuid4().hex}", "model": MODEL_ID,
                "results": [result(s, t) for s, t in zip(scores, texts)]}

    return await until_disconnect(request, work())
