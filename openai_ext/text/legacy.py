"""Routes of the pre-1.0 OpenAI API that old clients (python-openai 0.x) still call:
/engines, /engines/{id}/..., and /edits. Each answers through the modern service it stands for."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from ..core.api_model import ApiModel
from ..core.catalog import Catalog
from ..core.errors import NotFoundError
from ..embeddings.service import EmbeddingRequest, EmbeddingsService
from . import chat, completions
from .protocol import ChatCompletionRequest, CompletionRequest
from .service import TextService, generate


def _engine(card: dict[str, Any]) -> dict[str, Any]:
    return {"id": card["id"], "object": "engine", "created": card["created"], "owner": card["owned_by"],
            "ready": True, "permissions": None}


class EditRequest(ApiModel):
    model: str | None = None
    instruction: str = Field(min_length=1)
    input: str | None = ""
    n: int | None = Field(None, ge=1, le=20)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)


async def _edit(text: TextService, body: EditRequest, request: Request):
    """The instruction and the input, rendered through the model's chat template as one user turn;
    the answer in the old edits shape."""
    content = body.instruction if not body.input else f"{body.instruction}\n\n{body.input}"
    req = ChatCompletionRequest(messages=[{"role": "user", "content": content}], model=body.model, n=body.n,
                                temperature=body.temperature, top_p=body.top_p)
    result = await generate(text, request, chat, req)
    if not isinstance(result, dict):
        return result   # the client went away
    return {"object": "edit", "created": int(time.time()),
            "choices": [{"text": c["message"]["content"], "index": c["index"]} for c in result["choices"]],
            "usage": result["usage"]}


def router(text: TextService, embeddings: EmbeddingsService, catalog: Catalog) -> APIRouter:
    r = APIRouter()

    @r.get("/engines")
    async def list_engines():
        return {"object": "list", "data": [_engine(c) for c in catalog.cards()]}

    @r.get("/engines/{engine_id:path}")
    async def retrieve_engine(engine_id: str):
        cards = catalog.cards()
        for card in cards:
            if card["id"] == engine_id:
                return _engine(card)
        # like /models/{id}, any name is served by the loaded model when used for generation
        raise NotFoundError(f"The engine '{engine_id}' does not exist. Engines here: "
                            f"{', '.join(c['id'] for c in cards) or 'none'}.", param="engine_id",
                            code="model_not_found")

    # Engine ids may hold "/" (org/model). Routes match in order, so .../chat/completions comes
    # before .../completions, which would otherwise take it with the id "<id>/chat".
    @r.post("/engines/{engine_id:path}/chat/completions")
    async def engine_chat(engine_id: str, body: ChatCompletionRequest, request: Request):
        body.model = body.model or engine_id
        chat.check_tool_answers(body)
        return await generate(text, request, chat, body)

    @r.post("/engines/{engine_id:path}/completions")
    async def engine_completions(engine_id: str, body: CompletionRequest, request: Request):
        body.model = body.model or engine_id
        return await generate(text, request, completions, body)

    @r.post("/engines/{engine_id:path}/embeddings")
    async def engine_embeddings(engine_id: str, body: EmbeddingRequest, request: Request):
        body.model = body.model or engine_id
        return await embeddings.create(body, request)

    @r.post("/edits")
    async def create_edit(body: EditRequest, request: Request):
        return await _edit(text, body, request)

    @r.post("/engines/{engine_id:path}/edits")
    async def engine_edit(engine_id: str, body: EditRequest, request: Request):
        body.model = body.model or engine_id
        return await _edit(text, body, request)

    return r
