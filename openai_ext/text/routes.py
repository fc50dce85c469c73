"""The text family's routes: /v1/chat/completions and /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request

from . import chat, completions
from .protocol import ChatCompletionRequest, CompletionRequest
from .service import TextService, generate


def router(text: TextService) -> APIRouter:
    r = APIRouter()

    @r.post("/completions")
    async def create_completion(body: CompletionRequest, request: Request):
        return await generate(await text.lane(body.model, body.keep_alive), request, completions, body)

    @r.post("/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        chat.check_tool_answers(body)
        return await generate(await text.lane(body.model, body.keep_alive), request, chat, body)

    return r
