"""POST /v1/embeddings on a local sentence-transformers model, with dynamic batching.

Inputs are checked here, before the model is loaded; token-id arrays are decoded from
cl100k_base to text; the vectors come from the shared batcher (engines/embedding.py).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from . import token_ids
from .engines import Lazy
from .engines.embedding import Batcher, configured_model_id, load_batcher, model_available, to_base64
from .errors import InvalidRequestError, refuse_unknown_fields
from .models import card
from .state import ApiState

router = APIRouter()

MAX_INPUTS = 2048        # OpenAI's limit on the items of one request
MAX_INPUT_TOKENS = 8192  # OpenAI's limit on one input given as token ids
ENGINE_KEY = "embeddings"
TOKENS_KEY = "cl100k_base"
RENDER_INLINE = 16       # responses with more vectors than this are rendered on a worker thread
WATCH_FROM = 16          # requests with more inputs than this are stopped when their client leaves


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")   # kept to be named in the 400 (refuse_unknown_fields)

    input: Any                  # checked by parse_input, for errors that say what is wrong
    model: str | None = None    # any name is served by the configured model
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: StrictInt | None = Field(None, ge=1)
    user: str | None = None


def embedder(state: ApiState) -> Lazy[Batcher]:
    """The batcher around the embedding engine, shared with /v1/moderations; loads on first use."""
    lazy = state.engines.get(ENGINE_KEY)
    if lazy is None:
        lazy = state.engines.setdefault(ENGINE_KEY, Lazy(functools.partial(load_batcher, state.settings),
                                                         ENGINE_KEY))
    return lazy


def model_cards(state: ApiState) -> list[dict[str, Any]]:
    if not model_available(state.settings):
        return []   # nothing to serve it with: listing it would promise what a request cannot get
    lazy = state.engines.get(ENGINE_KEY)
    model_id = lazy.get_blocking().engine.model_id if lazy is not None and lazy.loaded \
        else configured_model_id(state.settings)
    return [card(model_id, state.started, "local")]


@router.get("/internal/embeddings/stats", include_in_schema=False)
async def batch_stats(request: Request) -> dict[str, Any]:
    """How the dynamic batcher has grouped requests so far (for tuning and benchmarks)."""
    state: ApiState = request.app.state.api
    lazy = state.engines.get(ENGINE_KEY)
    if lazy is None or not lazy.loaded:
        return {"loaded": False}
    batcher = lazy.get_blocking()
    return {"loaded": True, "model": batcher.engine.model_id, "window_ms": batcher.window_s * 1000,
            "gap_ms": batcher.gap_s * 1000, "max_batch": batcher.max_batch, **batcher.stats.as_dict()}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_tokens(ids: list[int], where: str) -> None:
    if len(ids) > MAX_INPUT_TOKENS:
        raise InvalidRequestError(f"'{where}' has {len(ids)} tokens; one input may have at most {MAX_INPUT_TOKENS} "
                                  "(OpenAI's limit). Split it.", param=where)


def parse_input(value: Any) -> tuple[list[str], list[list[int]] | None, list[str]]:
    """(texts, None, []) for text input, or ([], token arrays, the name of each array for errors)
    for token-id input; 400 for anything else."""
    shapes = "a string, a list of strings, a list of token ids, or a list of token-id lists"
    if isinstance(value, str):
        if not value:
            raise InvalidRequestError("'input' cannot be an empty string. Send some text to embed.", param="input")
        return [value], None, []
    if not isinstance(value, list):
        raise InvalidRequestError(f"'input' must be {shapes}.", param="input")
    if not value:
        raise InvalidRequestError("'input' cannot be an empty list. Send at least one text.", param="input")
    if all(_is_int(x) for x in value):
        # one input given as token ids: its length is a token count, not a number of inputs
        _check_tokens(value, "input")
        return [], [value], ["input"]
    if len(value) > MAX_INPUTS:
        raise InvalidRequestError(f"'input' has {len(value)} items; at most {MAX_INPUTS} are allowed in one request. "
                                  "Split it over several requests.", param="input")
    if all(isinstance(x, str) for x in value):
        for i, text in enumerate(value):
            if not text:
                raise InvalidRequestError(f"'input[{i}]' is an empty string; every input must hold some text.",
                                          param=f"input[{i}]")
        return list(value), None, []
    if all(isinstance(x, list) for x in value):
        for i, ids in enumerate(value):
            if not ids:
                raise InvalidRequestError(f"'input[{i}]' is an empty token list; every input must hold some tokens.",
                                          param=f"input[{i}]")
            if not all(_is_int(t) for t in ids):
                raise InvalidRequestError(f"'input[{i}]' must be a list of integer token ids.", param=f"input[{i}]")
            _check_tokens(ids, f"input[{i}]")
        return [], value, [f"input[{i}]" for i in range(len(value))]
    raise InvalidRequestError(f"'input' must be {shapes}; do not mix kinds in one list.", param="input")


async def texts_of(state: ApiState, value: Any) -> list[str]:
    texts, arrays, params = parse_input(value)
    if arrays is None:
        return texts
    lazy = state.engines.get(TOKENS_KEY) or state.engines.setdefault(
        TOKENS_KEY, Lazy(token_ids.load_encoding, TOKENS_KEY))
    encoding = await lazy.get()
    # decoding thousands of ids is real work: off the event loop
    return await anyio.to_thread.run_sync(token_ids.decode, encoding, arrays, params)


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


@router.post("/embeddings")
async def create_embeddings(body: EmbeddingRequest, request: Request) -> Response:
    from .app import until_disconnect

    state: ApiState = request.app.state.api
    refuse_unknown_fields(body, state.settings.allow_unknown_fields)
    texts = await texts_of(state, body.input)          # every 400 about the input comes before loading
    lazy = embedder(state)

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
