"""The images family's routes."""

from __future__ import annotations

from fastapi import APIRouter, Request

from .service import ImageGenerationRequest, ImagesService, openapi


def router(images: ImagesService) -> APIRouter:
    r = APIRouter(prefix="/images")

    @r.post("/generations")
    async def generations(body: ImageGenerationRequest):
        return await images.generations(body)

    @r.post("/edits", openapi_extra=openapi(need_prompt=True))
    async def edits(request: Request):
        return await images.img2img(request, need_prompt=True)

    @r.post("/variations", openapi_extra=openapi(need_prompt=False))
    async def variations(request: Request):
        return await images.img2img(request, need_prompt=False)

    return r
