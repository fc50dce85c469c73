"""A transcript in OpenAI's response formats: json, text, srt, vtt and verbose_json."""

from __future__ import annotations

import math
from typing import Any

from fastapi.responses import JSONResponse, Response

from . import stt
from .transcription_request import Job

TEXT_TYPE = "text/plain; charset=utf-8"


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
