"""The audio family's routes: speech, transcriptions and translations."""

from __future__ import annotations

from fastapi import APIRouter, Request

from .speech import SpeechRequest, SpeechService
from .transcription import TranscriptionService
from .transcription_request import openapi


def router(speech: SpeechService, transcription: TranscriptionService) -> APIRouter:
    r = APIRouter()

    @r.post("/audio/speech")
    async def create_speech(body: SpeechRequest, request: Request):
        return await speech.create(body, request)

    @r.post("/audio/transcriptions", openapi_extra=openapi("transcribe"))
    async def create_transcription(request: Request):
        return await transcription.serve(request, "transcribe")

    @r.post("/audio/translations", openapi_extra=openapi("translate"))
    async def create_translation(request: Request):
        return await transcription.serve(request, "translate")

    return r
