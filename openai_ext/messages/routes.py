"""The Messages family's routes: /v1/messages and /v1/messages/count_tokens. The threads that
/v1/messages keeps (threads.py) live as long as the router."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.auth import caller_owner
from ..text.service import TextService, generate
from . import connector, endpoint
from .protocol import CountTokensRequest, MessagesRequest
from .threads import Threads


def router(text: TextService) -> APIRouter:
    r = APIRouter()
    threads = Threads()

    @r.post("/messages")
    async def create_message(body: MessagesRequest, request: Request):
        lane = await text.lane(body.model, body.keep_alive)
        lane.require_model()
        asked = threads.resolve(body, caller_owner(request))
        mcp = connector.read(asked.request, request.headers, text.settings)
        if mcp is not None:
            return await endpoint.respond(lane, request, asked, mcp)
        return await generate(lane, request, endpoint, asked)

    @r.post("/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest):
        lane = await text.lane(body.model, body.keep_alive)
        lane.require_model()
        return await lane.tokenizer_work(endpoint.count_tokens, lane, body)

    return r
