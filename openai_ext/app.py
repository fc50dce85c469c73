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
| admin       | /models, /internal/...                                            |
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from . import __version__
from .admin import routes as admin
from .audio import routes as audio
from .core import tunnel
from .core.auth import KeyGuard
from .core.config import Settings
from .core.guards import LOCAL_NAMES, BodyLimit, CatchAll, HostGuard
from .core.handlers import install_error_handlers
from .embeddings import routes as embeddings
from .hosts.base import Host
from .hosts.manager import ModelManager
from .images import routes as images
from .moderations import routes as moderations
from .responses import routes as responses
from .state import ApiState
from .text import legacy
from .text import routes as text

# Routes that take file uploads, which have their own (larger) size limit.
UPLOAD_ROUTES = ("/audio/transcriptions", "/audio/translations", "/images/edits", "/images/variations")


def create_app(settings: Settings, host: Host, manager: ModelManager | None = None) -> FastAPI:
    """``manager`` (StandaloneModels or TextgenModels) enables model management."""
    state = ApiState.build(settings, host, manager)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        state.close()
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
    async def health():
        loaded = state.text.host.loaded
        queue = state.text.queue
        body = {"status": "ok" if loaded else "no model", "model_loaded": loaded,
                "queued": queue.waiting, "running": queue.running}
        return JSONResponse(body, status_code=200 if loaded else 503)

    routers = [
        admin.models_router(state.catalog),
        text.router(state.text),
        responses.router(state.responses),
        legacy.router(state.text, state.embeddings, state.catalog),
        embeddings.router(state.embeddings),
        moderations.router(state.moderations),
        audio.router(state.speech, state.transcription),
        images.router(state.images),
        admin.internal_router(state.text, state.manager),
    ]
    for router in routers:
        app.include_router(router, prefix="/v1")
    for router in routers:
        # The same routes without /v1, for clients configured with a bare base URL.
        app.include_router(router, include_in_schema=False)
    return app
