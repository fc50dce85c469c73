"""The Messages family's routes: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..text.service import TextService, generate
from . import endpoint
from .protocol import CountTokensRequest, MessagesRequest


def router(text: TextService) -> APIRouter:
    r = APIRouter()

    @r.post("/messages")
    async def create_message(body: MessagesRequest, request: Request):
        return await generate(text, request, endpoint, body)

    @r.post("/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest):
        text.require_model()
        return await text.tokenizer_work(endpoint.count_tokens, text, body)

    return r
