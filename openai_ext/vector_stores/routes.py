"""The vector store API's routes: /v1/vector_stores and, under a store, its files, file batches
and search."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from ..core.auth import caller_owner
from .requests import (
    CreateFileBatch,
    CreateVectorStore,
    CreateVectorStoreFile,
    ModifyVectorStore,
    SearchRequest,
    UpdateAttributes,
)
from .service import VectorStoresService

Order = Literal["asc", "desc"]
Status = Literal["in_progress", "completed", "failed", "cancelled"]


def router(stores: VectorStoresService) -> APIRouter:
    r = APIRouter()
    Limit = Query(20, ge=1, le=100)

    @r.post("/vector_stores")
    async def create_vector_store(body: CreateVectorStore, request: Request) -> dict[str, Any]:
        return await stores.create(body, caller_owner(request))

    @r.get("/vector_stores")
    async def list_vector_stores(request: Request, limit: int = Limit, order: Order = "desc",
                                 after: str | None = None, before: str | None = None) -> dict[str, Any]:
        return await stores.list_stores(caller_owner(request), order=order, after=after, before=before, limit=limit)

    @r.get("/vector_stores/{vector_store_id}")
    async def retrieve_vector_store(vector_store_id: str, request: Request) -> dict[str, Any]:
        return await stores.retrieve(vector_store_id, caller_owner(request))

    @r.post("/vector_stores/{vector_store_id}")
    async def modify_vector_store(vector_store_id: str, body: ModifyVectorStore, request: Request) -> dict[str, Any]:
        return await stores.modify(vector_store_id, body, caller_owner(request))

    @r.delete("/vector_stores/{vector_store_id}")
    async def delete_vector_store(vector_store_id: str, request: Request) -> dict[str, Any]:
        return await stores.delete(vector_store_id, caller_owner(request))

    @r.post("/vector_stores/{vector_store_id}/search")
    async def search_vector_store(vector_store_id: str, body: SearchRequest, request: Request) -> dict[str, Any]:
        return await stores.search(vector_store_id, body, caller_owner(request))

    @r.post("/vector_stores/{vector_store_id}/files")
    async def create_vector_store_file(vector_store_id: str, body: CreateVectorStoreFile,
                                       request: Request) -> dict[str, Any]:
        return await stores.add_file(vector_store_id, body, caller_owner(request))

    @r.get("/vector_stores/{vector_store_id}/files")
    async def list_vector_store_files(vector_store_id: str, request: Request, limit: int = Limit,
                                      order: Order = "desc", after: str | None = None, before: str | None = None,
                                      filter: Status | None = None) -> dict[str, Any]:
        return await stores.files_page(vector_store_id, caller_owner(request), status=filter, batch_id=None,
                                       order=order, after=after, before=before, limit=limit)

    @r.get("/vector_stores/{vector_store_id}/files/{file_id}")
    async def retrieve_vector_store_file(vector_store_id: str, file_id: str, request: Request) -> dict[str, Any]:
        return await stores.file(vector_store_id, file_id, caller_owner(request))

    @r.post("/vector_stores/{vector_store_id}/files/{file_id}")
    async def update_vector_store_file(vector_store_id: str, file_id: str, body: UpdateAttributes,
                                       request: Request) -> dict[str, Any]:
        return await stores.update_file(vector_store_id, file_id, body.attributes, caller_owner(request))

    @r.delete("/vector_stores/{vector_store_id}/files/{file_id}")
    async def delete_vector_store_file(vector_store_id: str, file_id: str, request: Request) -> dict[str, Any]:
        return await stores.delete_file(vector_store_id, file_id, caller_owner(request))

    @r.get("/vector_stores/{vector_store_id}/files/{file_id}/content")
    async def vector_store_file_content(vector_store_id: str, file_id: str, request: Request) -> dict[str, Any]:
        return await stores.content(vector_store_id, file_id, caller_owner(request))

    @r.post("/vector_stores/{vector_store_id}/file_batches")
    async def create_file_batch(vector_store_id: str, body: CreateFileBatch, request: Request) -> dict[str, Any]:
        return await stores.add_batch(vector_store_id, body, caller_owner(request))

    @r.get("/vector_stores/{vector_store_id}/file_batches/{batch_id}")
    async def retrieve_file_batch(vector_store_id: str, batch_id: str, request: Request) -> dict[str, Any]:
        return await stores.batch(vector_store_id, batch_id, caller_owner(request))

    @r.post("/vector_stores/{vector_store_id}/file_batches/{batch_id}/cancel")
    async def cancel_file_batch(vector_store_id: str, batch_id: str, request: Request) -> dict[str, Any]:
        return await stores.batch(vector_store_id, batch_id, caller_owner(request), cancel=True)

    @r.get("/vector_stores/{vector_store_id}/file_batches/{batch_id}/files")
    async def list_file_batch_files(vector_store_id: str, batch_id: str, request: Request, limit: int = Limit,
                                    order: Order = "desc", after: str | None = None, before: str | None = None,
                                    filter: Status | None = None) -> dict[str, Any]:
        return await stores.files_page(vector_store_id, caller_owner(request), status=filter, batch_id=batch_id,
                                       order=order, after=after, before=before, limit=limit)

    return r
