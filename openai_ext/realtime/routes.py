"""The Realtime family's route: ``GET /v1/realtime?model=...`` upgraded to a WebSocket.

The upgrade passes the key and Host guards as an HTTP request does (the key also as the
``openai-insecure-api-key.<key>`` subprotocol that browsers send), and, from a web page, the
Origin check. A session past ``realtime_max_sessions`` is told so in an ``error`` event and
closed with code 1013 (try again later).

``POST /v1/realtime/client_secrets`` makes a short-lived key for a client app, which opens that
socket only, its sessions starting from the configuration given with it (realtime/secrets.py).

``GET /v1/realtime/page`` serves page.html, a page to try the API from a browser (push to talk,
the answer played, both transcripts shown). It holds no secret, so it answers without the key; the
user pastes the key into it, and it connects to this server's own origin, which the Origin check
lets through.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import HTMLResponse

from ..core.api_model import allowed
from ..core.auth import CALLER_KEY, CALLER_SECRET, offered_tokens
from ..core.errors import InvalidRequestError, NotImplementedByServer, OpenAIError
from ..core.guards import refused_origin
from .connection import Session
from .events import error_event
from .secrets import ClientSecretRequest
from .service import RealtimeService

SUBPROTOCOL = "realtime"
PAGE = "page.html"


def page() -> str:
    return resources.files(__package__).joinpath(PAGE).read_text(encoding="utf-8")


def router(realtime: RealtimeService) -> APIRouter:
    r = APIRouter()

    @r.websocket("/realtime")
    async def realtime_socket(websocket: WebSocket, model: str | None = None):
        if await refused_origin(websocket, realtime.settings.cors_origins, same_host=True):
            return
        offered = [p.strip() for p in (websocket.headers.get("sec-websocket-protocol") or "").split(",")]
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        try:
            realtime.enter()
        except OpenAIError as e:
            await websocket.send_json(error_event(e))
            await websocket.close(code=1013, reason="too many realtime sessions")
            return
        # a client secret offered gives the session its start: the one the guard let it in by, where
        # a key is set (found once: a second lookup a moment later might find it expired), else a live one
        secret = (websocket.scope.get("state", {}).get(CALLER_SECRET)
                  or realtime.secrets.find(offered_tokens(websocket.headers.get, websocket=True)))
        try:
            await Session(websocket, realtime, realtime.model_name(model or (secret.model if secret else None)),
                          config=secret.session_config() if secret else None).run()
        finally:
            realtime.leave()

    @r.post("/realtime/client_secrets")
    async def create_client_secret(body: ClientSecretRequest, request: Request):
        return realtime.secrets.make(body, key=request.scope.get("state", {}).get(CALLER_KEY),
                                     model=realtime.model_name(None), voices_ok=realtime.check_voice,
                                     allow_unknown=allowed())

    @r.get("/realtime", include_in_schema=False)
    async def realtime_over_http(request: Request):
        # uvicorn hands an upgrade on as a plain GET when no WebSocket library is installed
        if "websocket" in (request.headers.get("upgrade") or "").lower():
            raise NotImplementedByServer("This server cannot take WebSocket connections: the websockets package is "
                                         "not installed where it runs (pip install websockets).",
                                         code="websocket_unavailable", retry=False)
        raise InvalidRequestError("/v1/realtime is a WebSocket: connect with ws:// (or wss://) and send Realtime "
                                  "events, as client.realtime.connect(model=...) does.", status=405)

    html = page()

    @r.get("/realtime/page", include_in_schema=False)
    async def realtime_page():
        return HTMLResponse(html, headers={"Cache-Control": "no-cache"})

    return r
