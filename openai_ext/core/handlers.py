"""The one place where failures become HTTP responses: always the API's own error object.

Guards that answer before the app (key, Host, body size) render through the same error shapes
(see guards.send_error); an exception that no handler takes becomes a 500 in the CatchAll guard.
Which API's shape a request gets (OpenAI's, or another family's dialect) is decided by the
``ErrorShapes`` the app hands in."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .dialects import OPENAI_ONLY, ErrorShapes
from .errors import OpenAIError, from_validation_errors

log = logging.getLogger("openai_ext.requests")


def error_response(exc: OpenAIError, request: Request | None = None,
                   shapes: ErrorShapes = OPENAI_ONLY) -> JSONResponse:
    log.debug("answered %d %s%s: %s", exc.status, exc.type, f" (param {exc.param})" if exc.param else "",
              exc.message)
    if request is None:
        status, body, headers = exc.status, exc.body(), exc.headers
    else:
        status, body, headers = shapes.reply(exc, request.url.path, request.headers.get)
    return JSONResponse(body, status_code=status, headers=headers or None)


def install_error_handlers(app: FastAPI, shapes: ErrorShapes = OPENAI_ONLY) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(request: Request, exc: OpenAIError):
        return error_response(exc, request, shapes)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(from_validation_errors(list(exc.errors())), request, shapes)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            err = OpenAIError(f"Invalid URL ({request.method} {request.url.path}). See README.md for the routes.",
                              status=404)
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            err = OpenAIError(f"Method {request.method} is not allowed on {request.url.path}"
                              f"{f'; use {allowed}' if allowed else ''}.", status=405,
                              headers=dict(exc.headers) if exc.headers else None)
        else:
            err = OpenAIError(str(exc.detail), status=exc.status_code)
        err.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(err, request, shapes)
