"""OpenAI error objects: the exception hierarchy and the one place that renders it.

Every failure the API reports goes through ``OpenAIError.body()``, so clients always get
``{"error": {"message", "type", "param", "code"}}`` with the status OpenAI would use.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

# A message names request paths through slots: {param} is the error's param, {key} a path of its
# ``paths`` or a phrase of its ``words``. Any other brace is text (a JSON example, a regex).
PARAM = "{param}"
_SLOT = re.compile(r"\{(\w+)\}")


class OpenAIError(Exception):
    """An error of the API. Its message may name request paths by slots rather than spell them
    out, so that a family that serves the chat machinery under its own names (Messages'
    ``tools[0].input_schema`` for chat's ``tools[0].function.parameters``) renames the paths
    (``renamed``) and the message follows. ``words`` are phrases a family may say its own way,
    chosen by their key (how to send an image, a remedy that differs per API)."""
    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, headers: dict[str, str] | None = None, retry: bool = True,
                 paths: Mapping[str, str] | None = None, words: Mapping[str, str] | None = None):
        self.template = message
        self.param = param
        self.paths = dict(paths or {})
        self.words = dict(words or {})
        super().__init__(self.message)
        self.code = code
        if status is not None:
            self.status = status
        self.headers = dict(headers or {})
        if not retry:
            # A missing part or a wrong setting of the server: the OpenAI SDKs retry 5xx answers
            # unless told that it will not help.
            self.headers["x-should-retry"] = "false"

    @property
    def message(self) -> str:
        def slot(m: re.Match[str]) -> str:
            key = m.group(1)
            if key == "param" and self.param is not None:
                return self.param
            return self.paths.get(key, self.words.get(key, m.group(0)))
        return _SLOT.sub(slot, self.template)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class InvalidRequestError(OpenAIError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequestError):
    def __init__(self, message: str, *, param: str = "messages", words: Mapping[str, str] | None = None):
        super().__init__(message, param=param, code="context_length_exceeded", words=words)


class AuthenticationError(OpenAIError):
    status = 401
    type = "invalid_request_error"

    def __init__(self, message: str = "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'."):
        super().__init__(message, code="invalid_api_key")


class PermissionDeniedError(OpenAIError):
    status = 403
    type = "invalid_request_error"


class NotFoundError(OpenAIError):
    status = 404
    type = "invalid_request_error"


class RequestTooLargeError(OpenAIError):
    status = 413
    type = "invalid_request_error"


class RateLimitError(OpenAIError):
    status = 429
    type = "rate_limit_error"


class ServerError(OpenAIError):
    status = 500
    type = "server_error"


class NotImplementedByServer(OpenAIError):
    status = 501
    type = "invalid_request_error"


class UpstreamError(OpenAIError):
    """A backend this server depends on (an optional engine, a proxied service) failed."""
    status = 502
    type = "server_error"


class ServiceUnavailableError(OpenAIError):
    status = 503
    type = "server_error"


def unrecognized(name: str, hint: str = "") -> InvalidRequestError:
    """A request field this server does not know, worded as OpenAI words it."""
    return InvalidRequestError(f"Unrecognized request argument supplied: {name}.{hint} Remove it or correct its "
                               "spelling; README.md lists the parameters.", param=name, code="unknown_parameter")


E = TypeVar("E", bound=OpenAIError)


class PathNames:
    r"""A family's names for chat's request paths: (regex, replacement) pairs tried in order on a
    path's start, up to a ``.``, a ``[`` or its end. The first that matches replaces that part and
    the rest is kept, so ``(r"tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema")``
    names ``tools[0].function.parameters.properties`` as ``tools[0].input_schema.properties``."""

    def __init__(self, *pairs: tuple[str, str]):
        self.pairs = [(re.compile(p + r"(?=[.\[]|$)"), r) for p, r in pairs]

    def __call__(self, path: str) -> str:
        for pattern, replacement in self.pairs:
            m = pattern.match(path)
            if m:
                return m.expand(replacement) + path[m.end():]
        return path


def renamed(err: E, name: Callable[[str], str], words: Mapping[str, str] | None = None) -> E:
    """``err`` as a family shows it: its param and the paths its message names, through ``name``
    (the family's names for chat's paths), and the phrases of ``words`` it says its own way."""
    if err.param is not None:
        err.param = name(err.param)
    err.paths = {k: name(v) for k, v in err.paths.items()}
    err.words.update({k: v for k, v in (words or {}).items() if k in err.words})
    err.args = (err.message,)
    return err


def refuse_unknown(names: Iterable[str], *, known: Iterable[str] = (), allow: bool = False,
                   elsewhere: Mapping[str, str] | None = None, where: str = "") -> None:
    """The one unknown-field check of every API: a 400 naming the first of ``names`` (fields of
    the body that the API does not take), unless the allow_unknown_fields setting (``allow``) is
    on. OpenAI refuses what it does not know, and so do we: a misspelt parameter (max_token)
    silently ignored would give the wrong answer. ``where``: the path of the object the names are
    in (``session.audio``), for a nested one. Request models do this by inheritance (ApiModel)."""
    first = next(iter(names), None)
    if first is None or allow:
        return
    raise unrecognized(f"{where}.{first}" if where else first, unknown_hint(first, known, elsewhere))


def unknown_hint(name: str, known: Iterable[str], elsewhere: Mapping[str, str] | None = None) -> str:
    """What to say of an unknown field: ``elsewhere[name]`` for a field the API knows to belong to
    another endpoint, else the closest of ``known`` (its own names), else nothing."""
    if elsewhere and name in elsewhere:
        return f" {elsewhere[name]}"
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean '{close[0]}'?" if close else ""


def internal_error(exc: BaseException) -> ServerError:
    """The error for an unexpected exception: it names the exception class, never its arguments,
    which could hold prompt text or secrets."""
    return ServerError(f"The server failed while handling the request ({type(exc).__name__}). "
                       "See the server log for details; retrying may help.")


def internal_error_body(exc: BaseException) -> dict[str, Any]:
    return internal_error(exc).body()


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "StrictStr", "StrictInt", "json-or-python"}


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or "-" in part)


_SHAPES = {"str": "a string", "StrictStr": "a string", "int": "an integer", "StrictInt": "an integer",
           "float": "a number", "bool": "a boolean", "dict": "an object", "list[str]": "a list of strings",
           "list[int]": "a list of integers", "list[list[int]]": "a list of integer lists"}


def _shape(tag: str) -> str:
    if tag in _SHAPES:
        return _SHAPES[tag]
    if tag.startswith("list[") and "Part" in tag:
        return "a list of content parts"
    return "a list" if tag.startswith("list[") else tag


def _union_error(errors: list[dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """pydantic reports a value that fits no branch of a union once per branch, and the first
    branch's complaint ("should be a valid string") is seldom the useful one. Returns the error to
    report and, when every branch refused the value's type outright, a list of the accepted shapes."""
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    k = next((i for i, part in enumerate(loc) if _is_tag(part)), None)
    if k is None:
        return first, None
    branches = [e for e in errors if len(e.get("loc", ())) > k and tuple(e["loc"][:k]) == loc[:k]
                and _is_tag(e["loc"][k])]
    if all(len(e["loc"]) == k + 1 and str(e.get("type", "")).endswith("_type") for e in branches):
        shapes = list(dict.fromkeys(_shape(e["loc"][k]) for e in branches))
        return first, ", ".join(shapes[:-1]) + f" or {shapes[-1]}" if len(shapes) > 1 else shapes[0]
    # the branch that got furthest into the value says what is wrong with it
    return max(branches, key=lambda e: (len(e["loc"]), not str(e.get("type", "")).endswith("_type"))), None


def _param_path(loc: tuple[Any, ...]) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'; stops at pydantic's union tags."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _is_tag(p):
            break
        else:
            out += ("." if out else "") + str(p)
    return out or None


def from_validation_errors(errors: list[dict[str, Any]]) -> InvalidRequestError:
    """A FastAPI/pydantic validation failure as one OpenAI error naming the parameter."""
    if not errors:
        return InvalidRequestError("The request body is invalid.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return InvalidRequestError("We could not parse the JSON body of your request: "
                                   f"{first.get('ctx', {}).get('error', 'invalid JSON')}. Send valid JSON "
                                   "with 'Content-Type: application/json'.")
    param = _param_path(tuple(first.get("loc", ())))
    if first.get("type") == "unknown_parameter":   # an ApiModel's field it does not take, at its path
        ctx = first.get("ctx", {})
        return unrecognized(f"{param}.{ctx['name']}" if param else ctx["name"], ctx.get("hint", ""))
    if first.get("type") == "missing":
        if param is None:
            return InvalidRequestError("The request needs a JSON body.")
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    if first.get("type") in ("model_attributes_type", "dict_type") and param is None:
        return InvalidRequestError("The request body must be a JSON object.")
    chosen, shapes = _union_error(errors)
    if shapes:
        msg = f"it must be {shapes}"
    elif chosen is not first and chosen.get("type") == "missing":
        msg = f"a required field is missing: '{chosen['loc'][-1]}'"
    else:
        msg = str(chosen.get("msg", "invalid value")).rstrip(".")   # (a validator's sentence ends in its own)
    return InvalidRequestError(f"Invalid value for '{param}': {msg}." if param else f"Invalid request: {msg}.",
                               param=param)
