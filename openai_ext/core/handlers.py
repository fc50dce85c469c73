"""The one place where failures become HTTP responses: always the API's own error object.

Guards that answer before the app (key, Host, body size) render through the same
``OpenAIError.body()`` (see guards.send_error); an exception that no handler takes becomes a 500
in the CatchAll guard."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import OpenAIError, from_validation_errors

log = logging.getLogger("openai_ext.requests")


def error_response(exc: OpenAIError) -> JSONResponse:
    log.debug("answered %d %s%s: %s", exc.status, exc.type, f" (param {exc.param})" if exc.param else "",
              exc.message)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        return error_response(from_validation_errors(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            err = OpenAIError(f"Invalid URL ({request.method} {request.url.path}). See README.md for the routes.",
                              status=404)
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            err = OpenAIError(f"Method {request.method} is not allowed on {request.url.path}"
                              f"{f'; use {allowed}' if allowed else ''}.", status=405, headers=exc.headers)
        else:
            err = OpenAIError(str(exc.detail), status=exc.status_code)
        err.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(err)
