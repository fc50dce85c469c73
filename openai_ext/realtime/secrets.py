"""Realtime client secrets (``POST /v1/realtime/client_secrets``): short-lived keys for a client
app (a web page, a phone) to open a Realtime session without holding the server's key.

An app's backend asks for one with the real key and hands its ``value`` (``ek_...``) to the
client, which connects to ``/v1/realtime`` with it as its bearer token or as the browser
subprotocol ``openai-insecure-api-key.<value>``. As at OpenAI, a secret opens any number of
sessions until it expires (10 s to 2 h after it was made, 10 min by default), a session it
opened goes on after that, and the session configuration given with it is where each of its
sessions starts (the client may still change it with ``session.update``).

A secret lets in the Realtime socket and nothing else: every other route still needs the key.
Sessions it opens belong to whoever made it (the key it was made with). Only a digest of each
value is kept, in memory: a restart ends every secret. At most ``MAX_LIVE`` are alive at once.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..core.api_model import ApiModel
from ..core.errors import InvalidRequestError, RateLimitError
from . import session as session_mod
from .events import field as get_field
from .events import new_id

PREFIX = "ek_"
SECONDS = (10, 7200)
DEFAULT_SECONDS = 600
MAX_LIVE = 1024


class ClientSecretRequest(ApiModel):
    expires_after: Any = None
    session: Any = None


class _ExpiresAfter(ApiModel):
    """expires_after's fields (read by hand in _seconds), for their names."""
    anchor: Any = None
    seconds: Any = None


@dataclass(frozen=True)
class Secret:
    expires_at: int
    config: session_mod.SessionConfig
    model: str | None
    key: str | None        # the key it was made with (whose its sessions are); None: no key is set

    def session_config(self) -> session_mod.SessionConfig:
        return self.config.copy()   # each session changes its own


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class ClientSecrets:
    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self._live: dict[str, Secret] = {}     # by the digest of the value
        self._lock = threading.Lock()          # (read by the key guard, made by a route)

    def make(self, body: ClientSecretRequest, *, key: str | None, model: str, voices_ok: Callable[[str], None],
             allow_unknown: bool) -> dict[str, Any]:
        """A new secret, as the response's body: its value, when it expires, and the session it
        starts (RealtimeCreateClientSecretResponse)."""
        seconds = _seconds(body.expires_after, allow_unknown)
        config, asked_model = session_mod.SessionConfig(), None
        if body.session is not None:
            if isinstance(body.session, dict) and body.session.get("type") == "transcription":
                raise InvalidRequestError("Transcription sessions are not served here: give a session of type "
                                          "\"realtime\" (its audio.input.transcription sets the transcription).",
                                          param="session.type")
            config = session_mod.update(config, body.session, voices_ok, allow_unknown=allow_unknown)
            asked_model = get_field(body.session, "model", str, where="session")
        now = int(self.clock())
        value = PREFIX + secrets.token_hex(16)
        secret = Secret(expires_at=now + seconds, config=config, model=asked_model, key=key)
        with self._lock:
            self._prune(now)
            if len(self._live) >= MAX_LIVE:
                raise RateLimitError(f"{MAX_LIVE} realtime client secrets are alive, the most this server keeps. "
                                     "Reuse one (each opens any number of sessions until it expires), or ask again "
                                     "once some have expired.", code="too_many_client_secrets")
            self._live[_digest(value)] = secret
        described = session_mod.describe(config, session_id=new_id("sess"), model=asked_model or model, expires_at=0)
        return {"value": value, "expires_at": secret.expires_at, "session": described}

    def find(self, tokens: list[str]) -> Secret | None:
        """The live secret among ``tokens`` (the keys a connection offers), if any."""
        candidates = [t for t in tokens if t.startswith(PREFIX)]
        if not candidates:
            return None
        with self._lock:
            self._prune(int(self.clock()))
            return next((s for s in (self._live.get(_digest(t)) for t in candidates) if s is not None), None)

    def _prune(self, now: int) -> None:
        for digest in [d for d, s in self._live.items() if s.expires_at <= now]:
            del self._live[digest]


def _seconds(expires_after: Any, allow_unknown: bool) -> int:
    if expires_after is None:
        return DEFAULT_SECONDS
    if not isinstance(expires_after, dict):
        raise InvalidRequestError("'expires_after' must be an object such as {\"anchor\": \"created_at\", "
                                  "\"seconds\": 600}.", param="expires_after")
    _ExpiresAfter.refuse_unknown_in(expires_after, allow=allow_unknown, where="expires_after")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise InvalidRequestError("'expires_after.anchor' must be \"created_at\" (the only anchor there is).",
                                  param="expires_after.anchor")
    seconds = expires_after.get("seconds", DEFAULT_SECONDS)
    if type(seconds) is not int or not SECONDS[0] <= seconds <= SECONDS[1]:
        raise InvalidRequestError(f"'expires_after.seconds' must be a whole number from {SECONDS[0]} to "
                                  f"{SECONDS[1]} (two hours).", param="expires_after.seconds")
    return seconds
