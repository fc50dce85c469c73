"""API keys. The key is compared in constant time and never logged."""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import AuthenticationError


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _matches(token: str | None, key: str) -> bool:
    # compare_digest: the time taken must not tell an attacker how much of the key matched
    return token is not None and hmac.compare_digest(token.encode(), key.encode())


def require_key(request: Request) -> None:
    """Every route but health: the api_key, when one is set (the admin key also passes)."""
    settings = request.app.state.api.settings
    if not settings.api_key:
        return
    token = _bearer(request)
    if not (_matches(token, settings.api_key) or (settings.admin_key and _matches(token, settings.admin_key))):
        raise AuthenticationError()


def require_admin(request: Request) -> None:
    """Model management and other internal routes: the admin_key, which defaults to the api_key."""
    settings = request.app.state.api.settings
    key = settings.admin_key or settings.api_key
    if key and not _matches(_bearer(request), key):
        raise AuthenticationError("This route needs the admin key: send 'Authorization: Bearer <admin_key>'.")
