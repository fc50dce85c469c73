"""The fields of a transcription or translation request, checked: every 400 about them is here."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..core.api_model import ApiModel, allowed
from ..core.errors import InvalidRequestError
from ..core.multipart import Form, JsonForm, form_schema
from . import stt

log = logging.getLogger(__name__)

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
# OpenAI's speech-to-text models; each is served by the configured Whisper model.
MODEL_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
LISTED_ALIASES = MODEL_ALIASES
GRANULARITIES = ("word", "segment")


class _Fields(ApiModel):
    """The fields this module reads (by hand, from a form), for their names: others get a 400
    naming them, as elsewhere in the API (unless the allow_unknown_fields setting is on)."""
    file: Any = None
    model: Any = None
    language: Any = None
    languages: Any = None
    prompt: Any = None
    keywords: Any = None
    response_format: Any = None
    temperature: Any = None
    timestamp_granularities: Any = None
    stream: Any = None
    include: Any = None
    chunking_strategy: Any = None
    known_speaker_names: Any = None
    known_speaker_references: Any = None
    user: Any = None




def openapi(task: str) -> dict[str, Any]:
    """The multipart body of the route, for the app's OpenAPI schema."""
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
    return form_schema(fields, ["file", "model"])


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


def parse(form: Form | JsonForm, task: str) -> Job:
    """Every check of the request's fields: a bad one raises a 400 naming it."""
    extra = sorted(form.names() - set(_Fields.model_fields))
    _Fields.refuse_unknown_in(extra, allow=allowed())
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

    _languages(form, job)
    job.prompt = form.text("prompt") or None
    keywords = [k.strip() for k in form.many("keywords") or [] if k.strip()]
    job.hotwords = ", ".join(keywords) or None

    temperature = form.text("temperature")
    if temperature not in (None, ""):
        job.temperature = _number(temperature, "temperature", 0.0, 1.0)

    _granularities(form, job)
    job.stream = form.flag("stream")
    if job.stream and fmt not in ("json", "text"):
        raise InvalidRequestError(f"stream=true sends transcript.text events, which carry no timestamps: use "
                                  f"response_format json or text with it, or drop stream for {fmt}.",
                                  param="stream")

    _include(form, job)
    job.vad = _chunking(form.object("chunking_strategy"))

    if extra:   # (the allow_unknown_fields setting let them pass)
        log.debug("ignoring unknown fields: %s", ", ".join(extra))
    return job


def _languages(form: Form | JsonForm, job: Job) -> None:
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


def _granularities(form: Form | JsonForm, job: Job) -> None:
    granularities = form.many("timestamp_granularities")
    if granularities:
        unknown = [g for g in granularities if g not in GRANULARITIES]
        if unknown:
            raise InvalidRequestError(f"Invalid timestamp_granularities {unknown}. Use word and/or segment.",
                                      param="timestamp_granularities")
        if job.response_format != "verbose_json":
            raise InvalidRequestError("timestamp_granularities needs response_format=verbose_json.",
                                      param="timestamp_granularities")
        job.words, job.segments = "word" in granularities, "segment" in granularities


def _include(form: Form | JsonForm, job: Job) -> None:
    include = form.many("include") or []
    for item in include:
        if item != "logprobs":
            raise InvalidRequestError(f"Invalid include value {item!r}. The only one is logprobs.", param="include")
    if include:
        if job.response_format != "json":
            raise InvalidRequestError("include=logprobs works with response_format=json only.", param="include")
        job.logprobs = True


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
