"""Health, for supervisors and load balancers: liveness and readiness, without a key.

- ``GET /health/live``: 200 whenever the process serves HTTP (restart it only when this fails).
- ``GET /health`` (also ``/health/ready`` and ``/v1/internal/health``): readiness, 200 only while
  this server can serve what it is for: a model loaded and answering (in upstream mode, the
  upstream engine reachable, as its host last found it) and, when responses are stored, the store
  answering. Otherwise 503, with what is wrong, so a load balancer sends clients elsewhere until it
  is fixed; the server keeps serving what it can (a chat while the store is down) to whoever still
  asks. The body says how many requests run and wait either way.

Nothing here waits on a dependency: each part is read from state its own calls keep up to date
(the store's heartbeat, the host's own checks).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ..responses.store_health import StoreHealth
from ..text.service import TextService


def router(text: TextService, store: StoreHealth | None) -> APIRouter:
    """``store``: the store's health, or None when nothing is stored (responses_store off)."""
    r = APIRouter()

    @r.get("/health/live", include_in_schema=False)
    async def live():
        return {"status": "alive"}

    @r.get("/health")
    @r.get("/health/ready", include_in_schema=False)
    @r.get("/v1/internal/health", include_in_schema=False)
    async def ready():
        host = text.host
        loaded = host.loaded
        problem = host.unavailable() if loaded else None
        upstream = host.readiness() if loaded else None
        queue = text.queue
        ready = loaded and problem is None and (upstream is None or upstream["ready"])
        status = "ok" if ready else "no model" if not loaded else "unavailable"
        body: dict[str, Any] = {"status": status, "model_loaded": loaded, "queued": queue.waiting,
                                "running": queue.running}
        if problem is not None:
            body["error"] = str(problem)   # what happened, and what to do
        if upstream is not None:
            body["upstream"] = upstream
            if not ready and "error" not in body and upstream.get("error"):
                body["error"] = upstream["error"]
        if store is not None:
            body["store"] = store.describe()
            if not store.up and status == "ok":
                body["status"] = "store unavailable"
        if text.lanes is not None:   # standalone's other models, by name
            body["models"] = text.lanes.describe()
            body["models_loading"] = text.lanes.loading()
        cells = host.kv_cells() if loaded else None
        if cells is not None:
            body["kv_cells"] = cells
        sequences = host.sequences() if loaded else None
        if sequences is not None:   # (a request "running" above may wait here for cells)
            body["sequences"] = sequences
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    return r
