"""OpenAI error objects: the exception hierarchy and the one place that renders it.

Every failure the API reports goes through ``OpenAIError.body()``, so clients always get
``{"error": {"message", "type", "param", "code"}}`` with the status OpenAI would use.
"""

from __future__ import annotations

from typing import Any


class OpenAIError(Exception):
    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, headers: dict[str, str] | None = None, retry: bool = True):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status
        self.headers = dict(headers or {})
        if not retry:
            # A missing part or a wrong setting of the server: the OpenAI SDKs retry 5xx answers
            # unless told that it will not help.
            self.headers["x-should-retry"] = "false"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class InvalidRequestError(OpenAIError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequestError):
    def __init__(self, message: str, *, param: str = "messages"):
        super().__init__(message, param=param, code="context_length_exceeded")


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


def internal_error(exc: BaseException) -> ServerError:
    """The error for an unexpected exception: it names the exception class, never its arguments,
    which could hold prompt text or secrets."""
    return ServerError(f"The server failed while handling the request ({type(exc).__name__}). "
                       "See the server log for details; retrying may help.")


def internal_error_body(exc: BaseException) -> dict[str, Any]:
    return internal_error(exc).body()


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "StrictStr", "StrictInt", "json-or-python"}


def _param_path(loc: tuple[Any, ...]) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'; stops at pydantic's union tags."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and (p in _TYPE_TAGS or "[" in p or "-" in p):
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
    if first.get("type") == "missing":
        if param is None:
            return InvalidRequestError("The request needs a JSON body.")
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    if first.get("type") in ("model_attributes_type", "dict_type") and param is None:
        return InvalidRequestError("The request body must be a JSON object.")
    msg = first.get("msg", "invalid value")
    return InvalidRequestError(f"Invalid value for '{param}': {msg}." if param else f"Invalid request: {msg}.",
                               param=param)
