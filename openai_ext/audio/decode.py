"""Uploaded audio files to the samples speech models take: float32, mono, 16 kHz.

Decoding happens in memory with PyAV (FFmpeg), so every container and codec FFmpeg knows is
accepted, whatever the file's name says: flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav, webm ...
A file FFmpeg cannot read, one without an audio track, or one that holds no samples is the
client's mistake and gets a 400 naming ``file``.
"""

from __future__ import annotations

import io
import logging
from typing import TYPE_CHECKING

from ..core.errors import (
    InvalidRequestError,
    RequestTooLargeError,
    ServiceUnavailableError,
)

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
# Decoded audio is held in memory as float32 (64 kB per second at 16 kHz), and a 25 MB upload of
# a low-bitrate codec can hold many hours. Longer audio is refused before it fills the memory.
DEFAULT_MAX_SECONDS = 2 * 3600
# Packets that fail to decode are skipped, as FFmpeg's own tools do, unless this many fail.
MAX_BAD_PACKETS = 100

SUPPORTED = "flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav or webm"


def _bad_file(why: str) -> InvalidRequestError:
    return InvalidRequestError(f"The file could not be read as audio: {why}. Send a {SUPPORTED} file.",
                               param="file", code="invalid_audio")


def decode(data: bytes, *, rate: int = SAMPLE_RATE, max_seconds: float = DEFAULT_MAX_SECONDS) -> "np.ndarray":
    """The first audio track of ``data`` as float32 mono samples at ``rate`` Hz. Blocking: call it
    from a worker thread."""
    if not data:
        raise InvalidRequestError("The file is empty. Send a file that holds audio.", param="file",
                                  code="invalid_audio")
    try:
        import av
        import numpy as np
    except ImportError as e:
        raise ServiceUnavailableError(
            f"Audio decoding needs PyAV, which is not installed ({e.name}). Run: pip install av",
            code="engine_unavailable", retry=False) from None

    try:
        # Tags in another encoding than UTF-8 (Latin-1 from many Windows tools) must not make a
        # good file unreadable: they are not used here.
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="replace")
    except (av.error.FFmpegError, ValueError, OSError) as e:
        raise _bad_file(f"it is not a known audio format or it is damaged ({_reason(e)})") from None
    with container:
        if not container.streams.audio:
            raise _bad_file("it has no audio track")
        stream = container.streams.audio[0]
        resampler: av.AudioResampler | None = None
        source: tuple[str, str, int] | None = None
        limit = int(max_seconds * rate)
        chunks: list[np.ndarray] = []
        total = bad = 0

        def keep(frames: list[av.AudioFrame]) -> None:
            nonlocal total
            for frame in frames:
                samples = frame.to_ndarray().reshape(-1)
                total += samples.size
                if total > limit:
                    raise RequestTooLargeError(
                        f"The audio is longer than {max_seconds / 60:g} minutes, the most this server "
                        "transcribes in one request. Split it into shorter files.",
                        param="file", code="audio_too_long")
                chunks.append(samples)

        try:
            for packet in container.demux(stream):
                try:
                    frames = packet.decode()
                except av.error.FFmpegError as e:
                    bad += 1
                    if bad > MAX_BAD_PACKETS:
                        raise _bad_file(f"too many damaged packets ({_reason(e)})") from None
                    continue
                for frame in frames:
                    shape = (frame.format.name, frame.layout.name, frame.sample_rate)
                    if resampler is None or shape != source:
                        # A track may change its rate or channels midway; a resampler serves one
                        # input shape, so the old one is drained and a new one takes over.
                        if resampler is not None:
                            keep(resampler.resample(None))
                        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
                        source = shape
                    keep(resampler.resample(frame))
            if resampler is not None:
                keep(resampler.resample(None))
        except av.error.FFmpegError as e:
            # A damaged or cut-off end after good audio: keep what was read, as players do.
            if not chunks:
                raise _bad_file(f"it is damaged ({_reason(e)})") from None
            log.warning("audio upload ends in damaged data after %.1f s: %s", total / rate, _reason(e))
        if bad:
            log.warning("skipped %d damaged packet(s) in an audio upload", bad)
    if not total:
        raise _bad_file("it holds no audio samples")
    return np.concatenate(chunks) if len(chunks) > 1 else chunks[0].copy()


def _reason(e: BaseException) -> str:
    # FFmpeg's own words ("Invalid data found when processing input"), not Python's repr
    return getattr(e, "strerror", None) or str(e) or type(e).__name__
