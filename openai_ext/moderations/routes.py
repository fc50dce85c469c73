"""The moderations family's route."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .service import ModerationRequest, ModerationsService


def router(moderations: ModerationsService) -> APIRouter:
    r = APIRouter()

    @r.post("/moderations")
    async def create_moderation(body: ModerationRequest, request: Request) -> Response:
        return await moderations.create(body, request)

    return r
