"""A session's input audio buffer: the audio appended since the last commit, kept as float32 at
Whisper's 16 kHz (turned so as it arrives, by one resampler per session, so chunk edges leave
no clicks), within ``realtime_max_buffer_s``; and the clock of the session's input audio, in
which server_vad's marks are given."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

from .audio import RATES, Resampler, to_float
from .events import ClientEventError

if TYPE_CHECKING:
    import numpy as np

RATE = 16_000
MIN_COMMIT_MS = 100       # OpenAI's least audio for a commit


def decode_b64(data: str, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ClientEventError(f"'{param}' is not valid base64. Send the audio bytes base64-encoded.",
                               param=param, code="invalid_value") from None


def to_16k(data: bytes, fmt: str) -> "np.ndarray":
    """A whole clip of wire audio at 16 kHz (an item's audio)."""
    return Resampler(RATES[fmt], RATE)(to_float(data, fmt))


class InputBuffer:
    def __init__(self, max_seconds: float):
        self.max = int(max_seconds * RATE)
        self.chunks: list["np.ndarray"] = []
        self.buffered = 0         # samples in the buffer
        self.start_ms = 0         # where the buffer starts on the session's input clock
        self.heard = 0            # samples appended in the whole session
        self.format: str | None = None
        self.resampler: Resampler | None = None

    @property
    def now_ms(self) -> int:
        return self.heard * 1000 // RATE

    def append(self, data: bytes, fmt: str) -> "np.ndarray":
        """Adds wire audio of ``fmt``; returns it at 16 kHz."""
        if self.resampler is None or fmt != self.format:
            self.format, self.resampler = fmt, Resampler(RATES[fmt], RATE)
        samples = self.resampler(to_float(data, fmt))
        if self.buffered + samples.size > self.max:
            raise ClientEventError(
                f"The input audio buffer holds {self.buffered / RATE:.1f} s, and this append would take it over the "
                f"limit of {self.max / RATE:g} s (the realtime_max_buffer_s setting). Commit or clear the buffer "
                "first.", code="input_audio_buffer_full", param="audio")
        self.chunks.append(samples)
        self.buffered += samples.size
        self.heard += samples.size
        return samples

    def drop_before(self, ms: int) -> None:
        """Forgets the audio before ``ms`` on the session's clock."""
        import numpy as np

        cut = (ms - self.start_ms) * RATE // 1000
        if cut <= 0 or not self.chunks:
            return
        joined = np.concatenate(self.chunks)[cut:]
        self.chunks, self.buffered = [joined], joined.size
        self.start_ms = ms

    def take(self, event_id: str | None) -> "np.ndarray":
        """The whole buffer, for a commit; the buffer is empty after."""
        import numpy as np

        if self.buffered * 1000 < MIN_COMMIT_MS * RATE:
            raise ClientEventError(f"Error committing input audio buffer: buffer too small. Expected at least "
                                   f"{MIN_COMMIT_MS}ms of audio, but buffer only has "
                                   f"{self.buffered * 1000 // RATE}ms of audio.",
                                   event_id=event_id, code="input_audio_buffer_commit_empty")
        audio = np.concatenate(self.chunks)
        self.clear()
        return audio

    def clear(self) -> None:
        self.chunks, self.buffered = [], 0
        self.start_ms = self.now_ms
