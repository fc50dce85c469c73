"""The audio of a realtime session: the formats on the wire, the way to Whisper's 16 kHz, and
the voice-activity detector of server_vad.

Formats, as OpenAI's Realtime API has them: ``audio/pcm`` (16-bit little-endian mono at 24 kHz),
``audio/pcmu`` and ``audio/pcma`` (G.711 mu-law and A-law at 8 kHz, telephony's). Input is turned
into float32 at 16 kHz as it arrives (one resampler per session, so chunk edges leave no clicks);
output, from the speech engine's rate, into the session's format.

The detector is Silero's, as faster-whisper ships it (the model audio/vad.py cuts silence with),
run here window by window with its state kept between appends, so speech is told apart from
silence while the user speaks, not after.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..audio.decode import SAMPLE_RATE as WHISPER_RATE
from ..audio.encode import OUTPUT_RATE, StreamEncoder

if TYPE_CHECKING:
    import numpy as np

FORMATS = ("audio/pcm", "audio/pcmu", "audio/pcma")
RATES = {"audio/pcm": OUTPUT_RATE, "audio/pcmu": 8000, "audio/pcma": 8000}
BYTES_PER_SAMPLE = {"audio/pcm": 2, "audio/pcmu": 1, "audio/pcma": 1}


# --- G.711 ------------------------------------------------------------------------------------

def _ulaw_to_linear(u: int) -> int:
    u = ~u & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return 0x84 - t if u & 0x80 else t - 0x84


def _alaw_to_linear(a: int) -> int:
    a ^= 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = t + 8 if seg == 0 else (t + 0x108) << max(0, seg - 1)
    return t if a & 0x80 else -t


def _linear_to_ulaw(pcm: int) -> int:
    pcm >>= 2
    mask = 0xFF
    if pcm < 0:
        pcm, mask = -pcm, 0x7F
    pcm = min(pcm, 8159) + 0x21
    seg = next((s for s, end in enumerate((0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF)) if pcm <= end), 8)
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((pcm >> (seg + 1)) & 0x0F)) ^ mask


def _linear_to_alaw(pcm: int) -> int:
    pcm >>= 3
    if pcm >= 0:
        mask = 0xD5
    else:
        mask, pcm = 0x55, -pcm - 1
    seg = next((s for s, end in enumerate((0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)) if pcm <= end), 8)
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((pcm >> 1 if seg < 2 else pcm >> seg) & 0x0F)) ^ mask


@functools.cache
def _tables(fmt: str) -> tuple["np.ndarray", "np.ndarray"]:
    """(byte -> int16, int16 + 32768 -> byte) for a G.711 format, built once."""
    import numpy as np

    to_linear, to_byte = (_ulaw_to_linear, _linear_to_ulaw) if fmt == "audio/pcmu" else \
        (_alaw_to_linear, _linear_to_alaw)
    decode = np.array([to_linear(b) for b in range(256)], dtype=np.int16)
    encode = np.array([to_byte(v) for v in range(-32768, 32768)], dtype=np.uint8)
    return decode, encode


def to_float(data: bytes, fmt: str) -> "np.ndarray":
    """Wire bytes of ``fmt`` as float32 samples at the format's rate."""
    import numpy as np

    if fmt == "audio/pcm":
        return np.frombuffer(data[:len(data) // 2 * 2], "<i2").astype(np.float32) / 32768
    decode, _ = _tables(fmt)
    return decode[np.frombuffer(data, np.uint8)].astype(np.float32) / 32768


def from_pcm16(data: bytes, fmt: str) -> bytes:
    """16-bit PCM (at the format's rate) as wire bytes of ``fmt``."""
    import numpy as np

    if fmt == "audio/pcm":
        return data
    _, encode = _tables(fmt)
    return encode[np.frombuffer(data, "<i2").astype(np.int32) + 32768].tobytes()


class Resampler:
    """Mono float32 audio from one rate to another, in pieces, with the filter's state kept
    between them (PyAV's resampler, FFmpeg's swresample)."""

    def __init__(self, rate_in: int, rate_out: int, fmt: str = "flt"):
        import av

        self.av = av
        self.rate_in = rate_in
        self.resampler = av.AudioResampler(format=fmt, layout="mono", rate=rate_out)
        self.pts = 0

    def __call__(self, pcm: "np.ndarray") -> "np.ndarray":
        import numpy as np

        if pcm.size == 0:
            return np.zeros(0, np.float32)
        frame = self.av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, np.float32).reshape(1, -1),
                                                format="flt", layout="mono")
        frame.sample_rate = self.rate_in
        frame.pts = self.pts
        frame.time_base = Fraction(1, self.rate_in)
        self.pts += pcm.size
        out = [f.to_ndarray().reshape(-1) for f in self.resampler.resample(frame)]
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


class OutputEncoder:
    """Speech (float32 at the engine's rate) as wire bytes of the session's output format."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.encoder = StreamEncoder("pcm")     # 16-bit at 24 kHz
        self.to_8k: Resampler | None = None if fmt == "audio/pcm" else Resampler(OUTPUT_RATE, 8000, "s16")
        self.samples = 0                        # at 24 kHz

    def write(self, pcm: "np.ndarray", rate: int) -> bytes:
        import numpy as np

        data = self.encoder.write(pcm, rate)
        self.samples += len(data) // 2
        if self.to_8k is None:
            return data
        narrow = self.to_8k(np.frombuffer(data, "<i2").astype(np.float32) / 32768)
        return from_pcm16(narrow.astype("<i2").tobytes(), self.fmt)

    @property
    def ms(self) -> int:
        return self.samples * 1000 // OUTPUT_RATE

    def close(self) -> None:
        self.encoder.close()


# --- turn detection ----------------------------------------------------------------------------

WINDOW = 512                # Silero's window at 16 kHz (32 ms)
CONTEXT = 64


@dataclass
class VadSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@functools.cache
def _silero() -> Any:
    from faster_whisper.vad import get_vad_model

    return get_vad_model()


class StreamingVad:
    """Speech start and end in a stream of 16 kHz audio: ``feed`` takes the samples appended and
    returns ("started", ms) and ("stopped", ms) marks, in the stream's milliseconds. Speech starts
    at the first window above the threshold (reported ``prefix_padding_ms`` earlier) and stops
    after ``silence_duration_ms`` of windows below it. Blocking (the model runs): call it from a
    worker thread."""

    def __init__(self, settings: VadSettings):
        import numpy as np

        self.settings = settings
        self.model = _silero()
        self.h = np.zeros((1, 1, 128), np.float32)
        self.c = np.zeros((1, 1, 128), np.float32)
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)
        self.done = 0               # samples run through the model
        self.speaking = False
        self.silence = 0            # samples of silence since the last speech
        self.start_ms = 0

    def feed(self, audio: "np.ndarray") -> list[tuple[str, int]]:
        import numpy as np

        marks: list[tuple[str, int]] = []
        self.pending = np.concatenate([self.pending, audio])
        windows = len(self.pending) // WINDOW
        if not windows:
            return marks
        batch, self.pending = self.pending[:windows * WINDOW], self.pending[windows * WINDOW:]
        s = self.settings
        for window in batch.reshape(-1, WINDOW):
            x = np.concatenate([self.context, window]).reshape(1, -1)
            prob, self.h, self.c = self.model.session.run(None, {"input": x, "h": self.h, "c": self.c})
            self.context = window[-CONTEXT:]
            p = float(np.asarray(prob).reshape(-1)[0])
            at_ms = self.done * 1000 // WHISPER_RATE
            self.done += WINDOW
            if not self.speaking and p >= s.threshold:
                self.speaking, self.silence = True, 0
                self.start_ms = max(0, at_ms - s.prefix_padding_ms)
                marks.append(("started", self.start_ms))
            elif self.speaking and p < max(0.0, s.threshold - 0.15):
                self.silence += WINDOW
                if self.silence * 1000 >= s.silence_duration_ms * WHISPER_RATE:
                    self.speaking = False
                    marks.append(("stopped", (self.done - self.silence) * 1000 // WHISPER_RATE))
            elif self.speaking:
                self.silence = 0
        return marks
