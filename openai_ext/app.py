"""create_app(): the FastAPI application. Routes are thin: they call a service and turn its
result into JSON or server-sent events. Authentication, CORS and the error handlers live here."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
from typing import Any, AsyncIterator, Awaitable

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__, chat, completions, models, tunnel
from .config import Settings
from .auth import KeyGuard
from .errors import OpenAIError, ServiceUnavailableError, from_validation_errors, internal_error_body
from .guards import LOCAL_NAMES, BodyLimit, CatchAll, HostGuard
from .hosts.base import Host
from .protocol import ChatCompletionRequest, CompletionRequest
from .state import ApiState

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
# Routes that take file uploads, which have their own (larger) size limit.
UPLOAD_ROUTES = ("/audio/transcriptions", "/audio/translations", "/images/edits", "/images/variations")


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def sse_event(obj: Any) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


def api(request: Request) -> ApiState:
    return request.app.state.api


# API families beyond chat and completions. Each module has a ``router`` (routes without the
# /v1 prefix) and may have ``model_cards(state)`` for the models it serves. Their heavy imports
# (torch, piper, faster-whisper) happen on first use, so the core serves chat without them.
FAMILY_MODULES = ("embeddings", "moderations", "speech", "transcription", "images", "legacy", "internal")


def families() -> list[Any]:
    """The family modules that import. One that fails is left out with one log line, so a broken
    optional part never takes chat and completions down with it."""
    found = []
    for name in FAMILY_MODULES:
        try:
            found.append(importlib.import_module(f"{__package__}.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                _warn_once(name, e)
        except Exception as e:  # noqa: BLE001 - see the docstring
            _warn_once(name, e)
    return found


_warned: set[str] = set()


def _warn_once(name: str, error: Exception) -> None:
    if name not in _warned:
        _warned.add(name)
        log.error("the %s endpoints are disabled: %s: %s", name, type(error).__name__, error)


async def sse_stream(chunks: AsyncIterator[dict[str, Any]], *, done: bool = True) -> AsyncIterator[bytes]:
    """Frames chunks as OpenAI does. An error after the stream began becomes an error event,
    and the stream still ends with [DONE] (``done``; OpenAI's audio streams end without it)."""
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
    except OpenAIError as e:
        yield sse_event(e.body())
    except Exception as e:  # noqa: BLE001 - the client must get an error object, not a cut stream
        log.exception("stream failed")
        yield sse_event(internal_error_body(e))
    finally:
        await chunks.aclose()
    if done:
        yield DONE


class GenerationStream(EventSourceResponse):
    """An event stream (a generation's, a transcription's) that gives up on a client that
    stopped reading.

    Such a client fills the socket's buffers, the send then waits, and the work waits with
    it, holding the queue's lock or the model's turn: everyone else would wait for a client
    that may never read again. After ``send_timeout`` seconds without progress the stream is closed, which
    stops the generation and frees the lock; the server then drops the connection."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException as e:
            if not _only_send_timeouts(e):
                raise
            log.warning("a client read nothing of its stream for %g s: the stream was dropped and its "
                        "work stopped (stream_send_timeout)", self.send_timeout)


def _only_send_timeouts(error: BaseException) -> bool:
    # sse-starlette raises the timeout bare (3.1+) or inside its task group's exception group
    # (a builtin from Python 3.11, anyio's backport before: both hold .exceptions)
    inner = getattr(error, "exceptions", None)
    if isinstance(inner, (list, tuple)) and inner:
        return all(_only_send_timeouts(e) for e in inner)
    return isinstance(error, SendTimeoutError)


def event_stream(chunks: AsyncIterator[dict[str, Any]], send_timeout: float | None = None, *,
                 done: bool = True) -> EventSourceResponse:
    return GenerationStream(sse_stream(chunks, done=done), sep="\n", ping=15, send_timeout=send_timeout)


async def until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Runs ``work``; if the client goes away first, cancels it, which stops its generation."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if task.cancelled() and watcher.done():
            log.info("client disconnected; generation stopped")
            return Response(status_code=499)
        raise
    finally:
        watcher.cancel()


def _error_response(exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)


def install_error_handlers(app: FastAPI) -> None:
    """The one place where failures become HTTP responses: always an OpenAI error object."""

    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError):
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        return _error_response(from_validation_errors(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            err = OpenAIError(f"Invalid URL ({request.method} {request.url.path}). See README.md for the routes.",
                              status=404)
        elif exc.status_code == 405:
            err = OpenAIError(f"Method {request.method} is not allowed on {request.url.path}.", status=405)
        else:
            err = OpenAIError(str(exc.detail), status=exc.status_code)
        err.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error_response(err)

    # Any other exception is turned into a 500 OpenAI error by the CatchAll guard (see
    # create_app), inside CORS, so that browser apps can read it too.


def build_router() -> APIRouter:
    r = APIRouter()

    @r.get("/models")
    async def list_models(request: Request):
        return models.list_models(api(request))

    @r.get("/models/{model_id:path}")
    async def retrieve_model(model_id: str, request: Request):
        return models.retrieve(api(request), model_id)

    @r.post("/completions")
    async def create_completion(body: CompletionRequest, request: Request):
        return await generate(request, completions, body)

    @r.post("/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        return await generate(request, chat, body)

    return r


async def generate(request: Request, service: Any, body: Any):
    """Runs a text-generation service (the chat or completions module) for one request."""
    state = api(request)
    if not state.host.loaded:
        raise ServiceUnavailableError("No model is loaded. Load one in the web UI, or with POST "
                                      "/v1/internal/model/load.", code="model_not_loaded")
    # The place in the queue is taken first: when the queue is full, the 429 comes at once, not
    # after every earlier request's prepare below. A request that fails there gives it back.
    ticket = state.queue.admit()
    try:
        # Every 400 happens here, before anything runs. Rendering and tokenizing a long prompt
        # is real work: it runs on a worker thread, one request at a time (a tokenizer may not
        # be safe to share between threads), so the event loop keeps serving.
        job = await anyio.to_thread.run_sync(service.prepare, state, body, limiter=state.limiter("prepare"))
    except BaseException:
        ticket.release()
        raise
    if job.plan.stream:
        return event_stream(service.stream(state, job, ticket), send_timeout=state.settings.stream_send_timeout)
    return await until_disconnect(request, service.complete(state, job, ticket))


def create_app(settings: Settings, host: Host, manager: Any = None) -> FastAPI:
    """``manager`` (model_manager.StandaloneModels or TextgenModels) enables model management."""
    state = ApiState(settings, host, manager=manager)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        state.queue.close()
        if tunnel.opens(settings):
            tunnel.stop()

    app = FastAPI(title="OpenAI-compatible API for local models", version=__version__,
                  docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.api = state
    install_error_handlers(app)
    # Middleware, innermost first: unexpected exceptions as 500 errors, the body limit, the key,
    # the Host check, and CORS outermost, so that even the guards' errors reach browser apps
    # readably. The key is checked before the body limit reads the body.
    app.add_middleware(CatchAll)
    app.add_middleware(BodyLimit, json_limit=int(settings.max_body_mb * 2 ** 20),
                       upload_limit=int(settings.max_upload_mb * 2 ** 20), upload_suffixes=UPLOAD_ROUTES)
    if settings.api_key:
        app.add_middleware(KeyGuard, api_key=settings.api_key, admin_key=settings.admin_key)
    if not settings.listen:
        app.add_middleware(HostGuard, allowed=LOCAL_NAMES | {h.lower() for h in settings.allowed_hosts},
                           allowed_suffixes=tunnel.host_suffixes(settings))
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=settings.cors_origins != ["*"])

    @app.get("/health")
    @app.get("/v1/internal/health", include_in_schema=False)
    async def health(request: Request):
        state = api(request)
        body = {"status": "ok" if state.host.loaded else "no model", "model_loaded": state.host.loaded,
                "queued": state.queue.waiting, "running": state.queue.running}
        return JSONResponse(body, status_code=200 if state.host.loaded else 503)

    routers = [build_router(), *(family.router for family in families())]
    for router in routers:
        app.include_router(router, prefix="/v1")
    for router in routers:
        # The same routes without /v1, for clients configured with a bare base URL.
        app.include_router(router, include_in_schema=False)
    return app
