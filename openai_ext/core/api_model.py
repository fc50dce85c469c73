"""The one base of every request model of every API family: unknown fields refused by inheritance.

OpenAI refuses a field it does not know, and so do we: a misspelt parameter (``max_token``)
silently ignored would give the wrong answer. A model that inherits ``ApiModel`` keeps the fields
it does not declare (``extra="allow"``) and, once the declared ones are valid, answers a 400
naming the first unknown one, with a hint (core.errors.refuse_unknown). A family says which extra
names another of its layers reads (``passes``: the host's samplers, the web UI's fields), which
names belong to another endpoint (``elsewhere``), and which further names a hint may suggest.

Whether unknown fields are allowed is the server's ``allow_unknown_fields`` setting. The models
are parsed by FastAPI, which cannot hand them a setting, so ``UnknownFields`` (an ASGI middleware
around every request and WebSocket) puts it in the request's context, where the check reads it.
Outside a request the default holds: refused (no stored body is parsed again).

Realtime's events are read by hand (their errors are ``error`` events that name the event), so
its shapes call ``refuse_unknown_in`` on each object, level by level, with the path it is at.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from .errors import refuse_unknown, unknown_hint

_ALLOW: ContextVar[bool] = ContextVar("allow_unknown_fields", default=False)


class UnknownFields:
    """ASGI middleware: the allow_unknown_fields setting, in the context of every request and
    WebSocket (including the app's own in-process requests: batch lines, query rewrites)."""

    def __init__(self, app: Any, allow: bool):
        self.app = app
        self.allow = allow

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        with unknown_fields(self.allow):
            await self.app(scope, receive, send)


def allowed() -> bool:
    """The allow_unknown_fields setting of the request being served."""
    return _ALLOW.get()


@contextmanager
def unknown_fields(allow: bool) -> Iterator[None]:
    """Models made inside take unknown fields as a server with allow_unknown_fields = ``allow``."""
    token = _ALLOW.set(allow)
    try:
        yield
    finally:
        _ALLOW.reset(token)


class ApiModel(BaseModel):
    """A request model (or a part of one whose unknown fields are refused, as Realtime's are)."""
    model_config = ConfigDict(extra="allow")

    # Extra names another layer of the family reads (they pass here, and that layer checks them).
    passes: ClassVar[frozenset[str]] = frozenset()
    # A field of another endpoint -> what to say instead of "did you mean".
    elsewhere: ClassVar[Mapping[str, str]] = {}
    # Names a hint may suggest beyond the declared fields (the host's samplers).
    hinted: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def known(cls) -> list[str]:
        return [*cls.model_fields, *cls.hinted]

    @classmethod
    def refuse_unknown_in(cls, names: Iterable[str], *, allow: bool, where: str = "") -> None:
        """A 400 naming the first of ``names`` that is neither a field of this model nor one that
        passes, under the path ``where`` (``session.audio``), unless ``allow``."""
        unknown = [n for n in names if n not in cls.model_fields and n not in cls.passes]   # (a hand-read dict)
        refuse_unknown(unknown, known=cls.known(), allow=allow, elsewhere=cls.elsewhere, where=where)

    @model_validator(mode="after")
    def _refuse_unknown(self) -> "ApiModel":
        # A validation error (not the API's error) so that pydantic puts the model's place in the
        # body before the name: files[0].colour. from_validation_errors words it as OpenAI does.
        if self.model_extra and not _ALLOW.get():
            cls = type(self)
            unknown = [n for n in self.model_extra if n not in cls.passes]   # (in the body's order)
            if unknown:
                raise PydanticCustomError("unknown_parameter", "Unrecognized request argument supplied: {name}",
                                          {"name": unknown[0], "hint": unknown_hint(unknown[0], cls.known(),
                                                                                    cls.elsewhere)})
        return self
