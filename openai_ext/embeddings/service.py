"""POST /v1/embeddings on a local sentence-transformers model, with dynamic batching.

Inputs are checked before the model is loaded; token-id arrays are decoded from cl100k_base to
text; the vectors come from the batcher, which /v1/moderations shares.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

import anyio
from fastapi import Request
from fastapi.responses import Response
from pydantic import Field, StrictInt

from ..core import token_tables
from ..core.api_model import ApiModel
from ..core.catalog import card
from ..core.config import Settings
from ..core.errors import InvalidRequestError, NotFoundError
from ..core.lazy import Lazy
from ..core.streaming import until_disconnect
from ..core.token_tables import TokenTables
from .batcher import Batcher, load_batcher
from .engine import configured_model_id, model_available, to_base64
from .inputs import embedding_input

RENDER_INLINE = 16       # responses with more vectors than this are rendered on a worker thread
WATCH_FROM = 16          # requests with more inputs than this are stopped when their client leaves


OPENAI_NAMES = ("text-embedding-3-small", "text-embedding-3-large", "text-embedding-ada-002")


class EmbeddingRequest(ApiModel):

    input: Any                  # checked by embedding_input, for errors that say what is wrong
    model: str | None = None    # required (checked in create, for OpenAI's wording); see accepts()
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: StrictInt | None = Field(None, ge=1)
    user: str | None = None


def render(model_id: str, vectors, counts: list[int], encoding_format: str) -> bytes:
    if encoding_format == "base64":
        data = [{"object": "embedding", "index": i, "embedding": to_base64(v)} for i, v in enumerate(vectors)]
    else:
        # tolist() gives the exact float32 values, so float and base64 decode to the same vectors
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
    tokens = sum(counts)
    body = {"object": "list", "data": data, "model": model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return json.dumps(body, separators=(",", ":")).encode()


class EmbeddingsService:
    def __init__(self, settings: Settings, tables: TokenTables, *, started: int):
        self.settings = settings
        self.tables = tables
        self.started = started
        # The batcher around the embedding engine, shared with /v1/moderations; loads on first use.
        self.batcher: Lazy[Batcher] = Lazy(functools.partial(load_batcher, settings), "embeddings")

    def model_cards(self) -> list[dict[str, Any]]:
        if not model_available(self.settings):
            return []   # nothing to serve it with: listing it would promise what a request cannot get
        return [card(self.model_id(), self.started, "local")]

    def model_id(self) -> str:
        return self.batcher.get_blocking().engine.model_id if self.batcher.loaded \
            else configured_model_id(self.settings)

    def accepts(self, name: str) -> bool:
        """The names this route serves: its model's id (and the setting that chose it) and OpenAI's
        embedding model names, which clients send by default. Any other name is a 404, as at
        OpenAI and as GET /v1/models/{name} answers."""
        model_id = self.model_id()
        # the model's hub name ("sentence-transformers/all-MiniLM-L6-v2") names it too
        return name in {model_id, self.settings.embedding_model, *OPENAI_NAMES} - {""} or \
            name.rsplit("/", 1)[-1] == model_id

    def alias_card(self, name: str) -> dict[str, Any] | None:
        """GET /v1/models/{name} for an OpenAI name this route serves (not listed in /v1/models,
        which lists real models only)."""
        if name in OPENAI_NAMES and model_available(self.settings):
            return card(name, self.started, "local")
        return None

    def stats(self) -> dict[str, Any]:
        """How the dynamic batcher has grouped requests so far (for tuning and benchmarks)."""
        if not self.batcher.loaded:
            return {"loaded": False}
        batcher = self.batcher.get_blocking()
        return {"loaded": True, "model": batcher.engine.model_id, "window_ms": batcher.window_s * 1000,
                "gap_ms": batcher.gap_s * 1000, "max_batch": batcher.max_batch, **batcher.stats.as_dict()}

    async def texts_of(self, value: Any) -> list[str]:
        texts, arrays, params = embedding_input(value)
        if arrays is None:
            return texts
        encoding = await self.tables.cl100k.get()
        # decoding thousands of ids is real work: off the event loop
        return await anyio.to_thread.run_sync(token_tables.decode, encoding, arrays, params)

    async def create(self, body: EmbeddingRequest, request: Request) -> Response:
        if not body.model:
            raise InvalidRequestError("Missing required parameter: 'model'. Send this server's embedding model "
                                      f"('{self.model_id()}') or one of OpenAI's names ({', '.join(OPENAI_NAMES)}).",
                                      param="model")
        if not self.accepts(body.model):
            raise NotFoundError(f"The model '{body.model}' does not exist. Embeddings here come from "
                                f"'{self.model_id()}', also served under OpenAI's names {', '.join(OPENAI_NAMES)}.",
                                param="model", code="model_not_found")
        texts = await self.texts_of(body.input)          # every 400 about the input comes before loading
        lazy = self.batcher

        async def work() -> Response:
            # the first request waits here for the model to load; a client that leaves meanwhile
            # stops waiting without disturbing the load the others wait for
            batcher = await lazy.get()
            engine = batcher.engine
            if body.dimensions is not None and body.dimensions > engine.dimension:
                raise InvalidRequestError(
                    f"'dimensions' is {body.dimensions}, but {engine.model_id} makes {engine.dimension}-dimensional "
                    f"embeddings. Ask for {engine.dimension} or fewer, or leave 'dimensions' out.", param="dimensions")
            vectors, counts = await batcher.embed(texts, body.dimensions)
            args = (engine.model_id, vectors, counts, body.encoding_format or "float")
            # a few vectors render in microseconds; thousands take long enough to stall other requests
            content = render(*args) if len(texts) <= RENDER_INLINE else await anyio.to_thread.run_sync(render, *args)
            return Response(content, media_type="application/json")

        if lazy.loaded and len(texts) <= WATCH_FROM:
            # A small request on a loaded model is one share of one batch, answered in milliseconds:
            # watching for its client to leave (two more tasks on the event loop) would cost more
            # than stopping it could save, and under load that cost is paid by every request.
            return await work()
        return await until_disconnect(request, work())

    def close(self) -> None:
        self.batcher.close()
