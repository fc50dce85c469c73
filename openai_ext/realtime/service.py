"""The Realtime family's shared parts: the engines a spoken turn runs through, borrowed from the
families that own them (Whisper from transcription, the text model's front door from text, the
speech engine from speech), and the count of sessions open, within ``realtime_max_sessions``.

A session's work takes its place in each engine's own line, as an HTTP request does: its
transcriptions take turns with /v1/audio/transcriptions, its generations with chat, its
sentences with /v1/audio/speech.
"""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable

import anyio

from ..audio import speech as speech_mod
from ..audio.speech import SpeechService
from ..audio.transcription import TranscriptionService
from ..audio.transcription_request import Job as TranscriptionJob
from ..audio.tts import TtsEngine
from ..core.config import Settings
from ..core.errors import OpenAIError, RateLimitError
from ..text.service import TextService
from .events import ClientEventError
from .secrets import ClientSecrets


class RealtimeService:
    def __init__(self, settings: Settings, text: TextService, speech: SpeechService,
                 transcription: TranscriptionService):
        self.settings = settings
        self.text = text
        self.speech = speech
        self.transcription = transcription
        self.open_sessions = 0
        self.secrets = ClientSecrets()   # the client secrets made and alive (realtime/secrets.py)

    # --- sessions ----------------------------------------------------------------------------
    def enter(self) -> None:
        limit = self.settings.realtime_max_sessions
        if self.open_sessions >= limit:
            raise RateLimitError(f"{limit} realtime sessions are open, the most this server takes (the "
                                 "realtime_max_sessions setting). Close one, or try again later.",
                                 code="session_limit_reached")
        self.open_sessions += 1

    def leave(self) -> None:
        self.open_sessions -= 1

    def model_name(self, asked: str | None) -> str:
        """The session's model: the name asked for (gpt-realtime and the like are served by the
        text model loaded here), else the loaded model's id."""
        return asked or self.text.host.model_id

    # --- speech in ---------------------------------------------------------------------------
    async def transcribe(self, audio: Any, options: dict[str, Any] | None,
                         on_piece: Callable[[str], Awaitable[None]] | None = None) -> str:
        """The transcript of ``audio`` (float32 at 16 kHz), in the transcription line's turn;
        ``on_piece`` hears each segment's text as soon as it is decoded."""
        options = options or {}
        job = TranscriptionJob(task="transcribe", model=options.get("model") or "whisper-1",
                               language=options.get("language") or None, prompt=options.get("prompt") or None)
        if job.language is not None and job.language != "en":
            job.language = _language(job.language)
        place = self.transcription.line.admit()
        try:
            engine = await self.transcription.engine(job)
        except BaseException:
            place.release()
            raise
        pieces: list[str] = []
        async with place:
            # greedy decoding: a short turn is heard as well, in about half the time of a beam search
            transcript = await anyio.to_thread.run_sync(functools.partial(
                engine.transcribe, audio, language=job.language, prompt=job.prompt, beam_size=1))
            segments = transcript.segments
            try:
                while (segment := await anyio.to_thread.run_sync(next, segments, None)) is not None:
                    text = segment.text if pieces else segment.text.lstrip()
                    if text:
                        pieces.append(text)
                        if on_piece is not None:
                            await on_piece(text)
            finally:
                close = getattr(segments, "close", None)
                if close:
                    close()
        return "".join(pieces).strip()

    # --- speech out --------------------------------------------------------------------------
    async def voice(self, name: str) -> tuple[TtsEngine, str]:
        tts = await self.speech.engine.get()
        return tts, speech_mod.resolve_voice(self.settings, tts, name)

    def check_voice(self, name: str) -> None:
        try:
            speech_mod.check_voice(self.settings, name)
        except OpenAIError as e:
            raise ClientEventError(e.message, param="session.audio.output.voice") from None

    def close(self) -> None:
        """Nothing of its own to close: the engines belong to their families."""


def _language(value: str) -> str:
    from ..audio.stt import language_code

    code = language_code(value)
    if code is None:
        raise ClientEventError(f"Unknown transcription language {value!r}; give an ISO-639-1 code such as 'en'.",
                               param="session.audio.input.transcription.language")
    return code
