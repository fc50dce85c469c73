"""The embeddings family's routes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .service import EmbeddingRequest, EmbeddingsService


def router(embeddings: EmbeddingsService) -> APIRouter:
    r = APIRouter()

    @r.post("/embeddings")
    async def create_embeddings(body: EmbeddingRequest, request: Request) -> Response:
        return await embeddings.create(body, request)

    @r.get("/internal/embeddings/stats", include_in_schema=False)
    async def batch_stats() -> dict[str, Any]:
        return embeddings.stats()

    return r
