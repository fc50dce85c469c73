"""The server's own OpenAPI document, made to say what the server really answers.

FastAPI documents a 422 with its own validation shape for every route with a body; this server
never sends it (validation errors are 400s with OpenAI's error object, core/handlers.py) and
does send 400, 401, 404, 413, 429, 500 and 503 in that shape. Routes that stream say so with
``text/event-stream`` beside their JSON answer."""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
ERRORS = {
    "400": "The request is invalid; the message says what to change.",
    "401": "The API key is missing or wrong.",
    "404": "No such route or model.",
    "413": "The body or upload is over its size limit.",
    "429": "The line is full; retry after Retry-After seconds.",
    "500": "The server or its model failed.",
    "503": "No model is loaded, or an engine is not installed or not set up.",
}


def install(app: FastAPI, streaming_paths: tuple[str, ...] = ()) -> Callable[[], dict[str, Any]]:
    """Replaces ``app.openapi`` with a document that lists the real error answers.
    ``streaming_paths`` are the routes that answer with server-sent events when asked to."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        schemas["Error"] = ERROR_SCHEMA
        for path, operations in doc.get("paths", {}).items():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                for status, description in ERRORS.items():
                    responses.setdefault(status, {"description": description, "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
                if path in streaming_paths and "200" in responses:
                    responses["200"].setdefault("content", {})["text/event-stream"] = {
                        "schema": {"type": "string", "description": "server-sent events, as the route's docs say"}}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
    return openapi
