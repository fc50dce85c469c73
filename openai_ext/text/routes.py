"""The text family's routes: /v1/chat/completions and /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.auth import caller_owner
from . import chat, completions, file_parts
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
        lane = await text.lane(body.model, body.keep_alive)
        # files read as text first, within what the lane's context could hold
        await file_parts.inline(body, caller_owner(request), text.file_reader, lane.host.context_length())
        return await generate(lane, request, chat, body)

    return r
