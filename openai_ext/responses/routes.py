"""The Responses family's routes: /v1/responses (and its WebSocket) and /v1/conversations."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, WebSocket
from starlette.requests import HTTPConnection

from ..core.auth import caller_owner
from ..core.errors import InvalidRequestError, NotImplementedByServer
from .conversations import Conversations
from .history import check_conversation_id
from .protocol import (
    AddItems,
    CompactRequest,
    CreateConversation,
    CreateResponse,
    InputTokensRequest,
    UpdateConversation,
)
from .service import ResponsesService
from .websocket import serve

Order = Literal["asc", "desc"]


def _conversation_id(conversation_id: str) -> str:
    check_conversation_id(conversation_id, "conversation_id")
    return conversation_id


# A conversation route's path id, checked before its route runs (a malformed one is a 400).
ConversationId = Annotated[str, Depends(_conversation_id)]


def router(responses: ResponsesService) -> APIRouter:
    r = APIRouter()
    conversations = Conversations(responses)

    def owner(request: HTTPConnection) -> str:
        return caller_owner(request)

    # --- responses ---------------------------------------------------------------------------
    @r.post("/responses")
    async def create_response(body: CreateResponse, request: Request):
        return await responses.respond(request, body, owner(request))

    @r.websocket("/responses")
    async def responses_socket(websocket: WebSocket):
        await serve(websocket, responses, owner(websocket))

    @r.get("/responses", include_in_schema=False)
    async def responses_upgrade_over_http(request: Request):
        # uvicorn hands an upgrade on as a plain GET when no WebSocket library is installed
        if "websocket" in (request.headers.get("upgrade") or "").lower():
            raise NotImplementedByServer("This server cannot take WebSocket connections: the websockets package is "
                                         "not installed where it runs (pip install websockets). Until then, use "
                                         "POST /v1/responses with stream: true.", code="websocket_unavailable",
                                         retry=False)
        raise InvalidRequestError(f"Method GET is not allowed on {request.url.path}; use POST (or a WebSocket).",
                                  status=405, headers={"Allow": "POST"})

    @r.post("/responses/compact")
    async def compact_response(body: CompactRequest, request: Request):
        return await responses.compact(request, body, owner(request))

    @r.post("/responses/input_tokens")
    async def count_input_tokens(body: InputTokensRequest, request: Request):
        return await responses.input_tokens(body, owner(request))

    @r.get("/responses/{response_id}")
    async def retrieve_response(response_id: str, request: Request, stream: bool = False,
                                starting_after: int | None = Query(None, ge=-1)):
        return await responses.retrieve(response_id, owner(request), stream_=stream, starting_after=starting_after)

    @r.delete("/responses/{response_id}")
    async def delete_response(response_id: str, request: Request):
        return await responses.delete(response_id, owner(request))

    @r.post("/responses/{response_id}/cancel")
    async def cancel_response(response_id: str, request: Request):
        return await responses.cancel(response_id, owner(request))

    @r.get("/responses/{response_id}/input_items")
    async def list_input_items(response_id: str, request: Request, after: str | None = None,
                               limit: int = Query(20, ge=1, le=100), order: Order = "desc"):
        return await responses.input_items(response_id, owner(request), after=after, limit=limit, order=order)

    # --- conversations -----------------------------------------------------------------------
    @r.post("/conversations")
    async def create_conversation(request: Request, body: CreateConversation | None = None):
        body = body or CreateConversation()
        return await conversations.create(body, owner(request))

    @r.get("/conversations/{conversation_id}")
    async def retrieve_conversation(conversation_id: ConversationId, request: Request):
        return await conversations.get(conversation_id, owner(request))

    @r.post("/conversations/{conversation_id}")
    async def update_conversation(conversation_id: ConversationId, body: UpdateConversation, request: Request):
        return await conversations.update(conversation_id, body, owner(request))

    @r.delete("/conversations/{conversation_id}")
    async def delete_conversation(conversation_id: ConversationId, request: Request):
        return await conversations.delete(conversation_id, owner(request))

    @r.post("/conversations/{conversation_id}/items")
    async def add_conversation_items(conversation_id: ConversationId, body: AddItems, request: Request):
        return await conversations.add_items(conversation_id, body, owner(request))

    @r.get("/conversations/{conversation_id}/items")
    async def list_conversation_items(conversation_id: ConversationId, request: Request, after: str | None = None,
                                      limit: int = Query(20, ge=1, le=100), order: Order = "desc"):
        return await conversations.list_items(conversation_id, owner(request), after=after, limit=limit, order=order)

    @r.get("/conversations/{conversation_id}/items/{item_id}")
    async def retrieve_conversation_item(conversation_id: ConversationId, item_id: str, request: Request):
        return await conversations.get_item(conversation_id, item_id, owner(request))

    @r.delete("/conversations/{conversation_id}/items/{item_id}")
    async def delete_conversation_item(conversation_id: ConversationId, item_id: str, request: Request):
        return await conversations.delete_item(conversation_id, item_id, owner(request))

    return r
