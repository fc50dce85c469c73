"""The Batch API's routes: /v1/batches (create, list), /v1/batches/{id} and its cancel."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from ..core.auth import caller_owner
from .service import BatchesService, CreateBatch


def router(batches: BatchesService) -> APIRouter:
    r = APIRouter()

    @r.post("/batches")
    async def create_batch(body: CreateBatch, request: Request) -> dict[str, Any]:
        return await batches.create(body, caller_owner(request))

    @r.get("/batches")
    async def list_batches(request: Request, after: str | None = None,
                           limit: int = Query(20, ge=1, le=100)) -> dict[str, Any]:
        return await batches.list(caller_owner(request), after=after, limit=limit)

    @r.get("/batches/{batch_id}")
    async def retrieve_batch(batch_id: str, request: Request) -> dict[str, Any]:
        return await batches.retrieve(batch_id, caller_owner(request))

    @r.post("/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
        return await batches.cancel(batch_id, caller_owner(request))

    return r
