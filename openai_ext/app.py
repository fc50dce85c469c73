"""create_app(): the composition root. It builds every family's service once (ApiState), mounts
each family's routes, and puts the guards in front. The families are listed here, explicitly:
this is the one module that knows them all.

Route groups, all under /v1 (and again without it, for clients given a bare base URL):

| family      | routes                                                            |
|-------------|-------------------------------------------------------------------|
| text        | /chat/completions, /completions, legacy /engines/... and /edits   |
| responses   | /responses, /conversations                                        |
| embeddings  | /embeddings                                                       |
| moderations | /moderations                                                      |
| audio       | /audio/speech, /audio/transcriptions, /audio/translations         |
| images      | /images/generations, /images/edits, /images/variations            |
| messages    | /messages, /messages/count_tokens (Anthropic's Messages API)      |
| realtime    | /realtime (a WebSocket: OpenAI's Realtime API), /realtime/page    |
| admin       | /models, /internal/...                                            |

Errors come in the shape of the API a route belongs to: OpenAI's, except on the Messages routes
(and /models asked with anthropic-version), which answer in Anthropic's shape. The table of
those dialects is built here and handed to the error handlers and to every guard.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from . import __version__
from .admin import health
from .admin import routes as admin
from .audio import routes as audio
from .batches import routes as batches
from .core import debuglog, openapi, tunnel
from .core.api_model import UnknownFields
from .core.auth import KeyGuard
from .core.config import Settings
from .core.debuglog import RequestLog
from .core.dialects import Dialect, ErrorShapes
from .core.drain import Drain
from .core.guards import LOCAL_NAMES, BodyLimit, CatchAll, HostGuard
from .core.handlers import install_error_handlers
from .embeddings import routes as embeddings
from .files import routes as files
from .hosts.base import Host
from .hosts.manager import ModelManager
from .images import routes as images
from .messages import errors as messages_errors
from .messages import models as messages_models
from .messages import routes as messages
from .moderations import routes as moderations
from .realtime import routes as realtime
from .responses import routes as responses
from .state import ApiState
from .text import legacy
from .text import routes as text
from .vector_stores import routes as vector_stores

# Routes that answer with server-sent events when asked to (documented in /openapi.json).
STREAMING_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/audio/speech",
                   "/v1/audio/transcriptions")
# Routes that take file uploads, which have their own (larger) size limit.
UPLOAD_ROUTES = ("/audio/transcriptions", "/audio/translations", "/images/edits", "/images/variations")
# Routes whose bodies are counted as they arrive, never read whole into memory (files_max_mb).
STREAMED_ROUTES = ("/v1/files", "/files")

# Routes that answer errors in Anthropic's shape: the Messages API, and the model list for
# Anthropic's clients (they send anthropic-version with every request).
ERROR_SHAPES = ErrorShapes([
    Dialect(("/v1/messages", "/messages"), messages_errors.reply),
    Dialect(("/v1/models", "/models"), messages_errors.reply, header=messages_models.HEADER),
])


def create_app(settings: Settings, host: Host, manager: ModelManager | None = None) -> FastAPI:
    """``manager`` (StandaloneModels or TextgenModels) enables model management."""
    state = ApiState.build(settings, host, manager)

    @contextlib.asynccontextmanager
    async def lifespan(app_: FastAPI):
        await state.batches.start(app_)   # batches run on the server's own loop, through the app
        await state.vector_stores.start(app_)   # so does ingestion into vector stores
        yield
        await state.vector_stores.stop()
        await state.batches.stop()
        state.close()
        if tunnel.opens(settings):
            tunnel.stop()

    app = FastAPI(title="OpenAI-compatible API for local models", version=__version__,
                  docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.api = state
    app.state.drain = Drain()   # told by the server when it begins to shut down (core/drain.py)
    install_error_handlers(app, ERROR_SHAPES)
    # Middleware, innermost first: the allow_unknown_fields setting in each request's context,
    # unexpected exceptions as 500 errors, the body limit, the key,
    # the Host check, and CORS outermost, so that even the guards' errors reach browser apps
    # readably. The key is checked before the body limit reads the body.
    app.add_middleware(UnknownFields, allow=settings.allow_unknown_fields)   # read by every ApiModel
    app.add_middleware(CatchAll, shapes=ERROR_SHAPES)
    debuglog.configure(settings.debug, settings.debug_streams)
    if settings.debug:
        app.add_middleware(RequestLog)   # sees the body BodyLimit has read whole
    app.add_middleware(BodyLimit, json_limit=int(settings.max_body_mb * 2 ** 20),
                       upload_limit=int(settings.max_upload_mb * 2 ** 20), upload_suffixes=UPLOAD_ROUTES,
                       streamed=(STREAMED_ROUTES, int(settings.files_max_mb * 2 ** 20), "files_max_mb"),
                       shapes=ERROR_SHAPES)
    if settings.api_key:
        app.add_middleware(KeyGuard, api_key=settings.api_key, admin_key=settings.admin_key, shapes=ERROR_SHAPES,
                           secrets=state.realtime.secrets)
    if not settings.listen:
        app.add_middleware(HostGuard, allowed=LOCAL_NAMES | {h.lower() for h in settings.allowed_hosts},
                           allowed_suffixes=tunnel.host_suffixes(settings), shapes=ERROR_SHAPES)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=settings.cors_origins != ["*"])

    routers = [
        admin.models_router(state.catalog, [messages_models.AnthropicModels(state.text)]),
        text.router(state.text),
        messages.router(state.text),
        responses.router(state.responses),
        legacy.router(state.text, state.embeddings, state.catalog),
        embeddings.router(state.embeddings),
        moderations.router(state.moderations),
        audio.router(state.speech, state.transcription),
        images.router(state.images),
        realtime.router(state.realtime),
        files.router(state.files),
        batches.router(state.batches),
        vector_stores.router(state.vector_stores),
        admin.internal_router(state.text, state.manager),
    ]
    app.include_router(health.router(state.text, state.responses.store.health if settings.responses_store else None))
    for router in routers:
        app.include_router(router, prefix="/v1")
    for router in routers:
        # The same routes without /v1, for clients configured with a bare base URL.
        app.include_router(router, include_in_schema=False)
    openapi.install(app, streaming_paths=STREAMING_PATHS)
    return app
