"""API keys. Keys are compared in constant time and never logged.

The api_key is checked by an ASGI guard in front of every route but health, before the body is
read: a client without the key never gets a body buffered or parsed for it. The admin key is a
route dependency of the model-management routes.

A key is sent as ``Authorization: Bearer <key>`` (OpenAI's clients) or as ``x-api-key: <key>``
(Anthropic's clients); either header is read, on every route. A WebSocket upgrade may carry it as
the subprotocol ``openai-insecure-api-key.<key>`` instead: browsers cannot set headers on a
WebSocket, and OpenAI's browser clients send the key that way. The Realtime socket also takes a
live Realtime client secret made with a key (realtime/secrets.py), as that key. The guard records the key it let a
request in with (``caller_owner`` reads it): every family tells callers apart by that one record,
whichever way the key came.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Callable, Protocol

from fastapi import Request
from starlette.requests import HTTPConnection

from . import tunnel
from .config import Settings
from .dialects import OPENAI_ONLY, ErrorShapes
from .errors import AuthenticationError, PermissionDeniedError
from .guards import Receive, Scope, Send, header, send_error

# Health answers without a key, so a supervisor or a load balancer can poll it; so does the
# Realtime try-it page, which holds no secret (the user pastes the key into it).
OPEN_PATHS = frozenset({"/health", "/health/live", "/health/ready", "/v1/internal/health", "/v1/realtime/page",
                        "/realtime/page"})
# The one socket a Realtime client secret (``ek_...``, realtime/secrets.py) lets in.
SECRET_PATHS = frozenset({"/v1/realtime", "/realtime"})


class SecretFinder(Protocol):
    def find(self, tokens: list[str]) -> Any: ...   # the live secret offered (its .key: whose it is), or None


def _bearer(authorization: str | None) -> str | None:
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _tokens(get) -> list[str]:
    """The keys a request offers: its bearer token and its x-api-key, as sent. ``get`` reads a
    header by its lower-case name."""
    return [t for t in (_bearer(get("authorization")), get("x-api-key")) if t is not None]


SUBPROTOCOL_KEY = "openai-insecure-api-key."


def subprotocol_tokens(offered: str | None) -> list[str]:
    """The keys offered in a Sec-WebSocket-Protocol header."""
    return [p.strip()[len(SUBPROTOCOL_KEY):] for p in (offered or "").split(",")
            if p.strip().startswith(SUBPROTOCOL_KEY) and len(p.strip()) > len(SUBPROTOCOL_KEY)]


def offered_tokens(get: Callable[[str], str | None], *, websocket: bool) -> list[str]:
    """Every key a request offers (a WebSocket's subprotocol ones too); ``get`` reads a header."""
    return _tokens(get) + (subprotocol_tokens(get("sec-websocket-protocol")) if websocket else [])


def _matches(token: str | None, key: str) -> bool:
    # compare_digest: the time taken must not tell an attacker how much of the key matched
    return token is not None and hmac.compare_digest(token.encode(), key.encode())


CALLER_KEY = "caller_key"   # in the request's scope state: the key the guard let it in with
CALLER_OWNER = "caller_owner"   # ... or, for a request the server makes itself, whose it is
CALLER_SECRET = "caller_secret"   # ... and the client secret it let a Realtime socket in by (what it found)

# The scope key of a request the server sends itself, in process (a batch's lines: batches/run.py),
# on behalf of an owner it recorded. Only code in this process can put an object in a scope (a
# connection's scope is built by the server from the wire), so the guard lets such a request in.
INTERNAL = "openai_ext.internal"


class Internal:
    """The mark of an in-process request (``scope[INTERNAL]``)."""


TRUSTED = Internal()


def caller_owner(conn: HTTPConnection) -> str:
    """Who a request comes from, for the objects it makes and may see: a digest of the key the guard
    let it in with (header or subprotocol alike); "" on a server that takes no key."""
    state = conn.scope.get("state", {})
    if conn.scope.get(INTERNAL) is TRUSTED and isinstance(state.get(CALLER_OWNER), str):
        return str(state[CALLER_OWNER])
    key = state.get(CALLER_KEY)
    return owner_of(key) if key else ""


def owner_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class KeyGuard:
    """Every route but health needs the api_key, when one is set (the admin key also passes);
    so does a WebSocket upgrade, which carries the same headers."""

    def __init__(self, app: Any, api_key: str, admin_key: str, shapes: ErrorShapes = OPENAI_ONLY,
                 secrets: SecretFinder | None = None):
        self.app = app
        self.keys = [k for k in (api_key, admin_key) if k]
        self.shapes = shapes
        self.secrets = secrets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS"
                and scope["path"] not in OPEN_PATHS and scope.get(INTERNAL) is not TRUSTED):
            tokens = offered_tokens(lambda name: header(scope, name.encode()), websocket=scope["type"] == "websocket")
            caller = next((token for token in tokens if any(_matches(token, key) for key in self.keys)), None)
            if caller is None and scope["type"] == "websocket" and scope["path"] in SECRET_PATHS and self.secrets:
                secret = self.secrets.find(tokens)
                caller = secret.key if secret is not None else None   # its sessions are its maker's
                if secret is not None:   # (the session starts from it: looked up again, it might have expired)
                    scope.setdefault("state", {})[CALLER_SECRET] = secret
            if caller is None:
                await send_error(send, AuthenticationError(), scope, self.shapes)
                return
            scope.setdefault("state", {})[CALLER_KEY] = caller
        await self.app(scope, receive, send)


def require_admin(settings: Settings) -> Callable[[Request], None]:
    """The dependency of model and LoRA management and stop-generation: the admin_key, which
    defaults to the api_key.

    With no key at all, a local user manages models freely, as in the web UI; but a request from
    a web page (browsers always send Origin with a cross-site POST, and CORS lets any origin call
    the API) is refused, so no site the user visits can load or unload models. With an open
    public tunnel every request may come from the internet (through 127.0.0.1), so all are refused."""

    def check(request: Request) -> None:
        key = settings.admin_key or settings.api_key
        if key:
            if not any(_matches(token, key) for token in _tokens(request.headers.get)):
                raise AuthenticationError("This route needs the admin key: send 'Authorization: Bearer <admin_key>'.")
        elif tunnel.opens(settings):
            raise PermissionDeniedError("This route is closed while the public tunnel is open without a key: anyone "
                                        "on the internet could use it. Set admin_key (or api_key) and send it as "
                                        "'Authorization: Bearer <key>'.", code="admin_key_required")
        elif request.headers.get("origin"):
            raise PermissionDeniedError("Model management from a web page needs an admin key: set admin_key (or "
                                        "api_key) and send it as 'Authorization: Bearer <key>'.",
                                        code="admin_key_required")

    return check
