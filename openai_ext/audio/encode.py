"""Synthesized speech into the six formats of OpenAI's speech API, encoded as it is produced.

Every format is 24 kHz mono, as OpenAI sends it; ``pcm`` is raw 16-bit little-endian samples with
no header. ``StreamEncoder`` takes float32 PCM piece by piece (one sentence at a time) and gives
back the bytes each piece completes, so a response can stream audio while later sentences are
still being synthesized.

PyAV is imported lazily, so the core server starts without it. The containers are written to a
sink that cannot seek: muxers then never go back to patch a header after its bytes were sent.
WAV therefore carries 0xFFFFFFFF as its sizes (the convention for streamed WAV, which decoders
read to the end), and FLAC's STREAMINFO leaves the total sample count at 0 (unknown).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ..core.errors import ServiceUnavailableError

OUTPUT_RATE = 24_000


@dataclass(frozen=True)
class OutputFormat:
    name: str
    content_type: str
    container: str | None = None        # None: raw samples, no container
    codec: str | None = None
    bit_rate: int | None = None
    # Muxer options. Ogg otherwise holds up to a second of audio per page before it writes any.
    options: dict[str, str] = field(default_factory=dict)
    # Encoder options. The faster settings chosen here cut the encoders' share of the work by half
    # or more (mp3: LAME -q7; opus: complexity 5; aac: the fast coder), which for one synthetic
    # voice at these bit rates is not worth its cost in real-time factor.
    codec_options: dict[str, str] = field(default_factory=dict)


FORMATS: dict[str, OutputFormat] = {f.name: f for f in (
    OutputFormat("mp3", "audio/mpeg", "mp3", "libmp3lame", 64_000, codec_options={"compression_level": "7"}),
    OutputFormat("opus", "audio/opus", "ogg", "libopus", 32_000, {"page_duration": "100000"},
                 {"compression_level": "5"}),
    OutputFormat("aac", "audio/aac", "adts", "aac", 64_000, codec_options={"aac_coder": "fast"}),
    OutputFormat("flac", "audio/flac", "flac", "flac"),
    OutputFormat("wav", "audio/wav", "wav", "pcm_s16le"),
    OutputFormat("pcm", "audio/pcm"),
)}


def content_type(fmt: str) -> str:
    return FORMATS[fmt].content_type


def _import_av() -> Any:
    try:
        import av
    except ImportError:
        raise ServiceUnavailableError(
            "Encoding speech needs PyAV: pip install av (it bundles the FFmpeg libraries).", retry=False) from None
    return av


class _Sink:
    """A write-only file for PyAV: it has no seek(), so the muxer treats the output as a stream."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class StreamEncoder:
    """Encodes mono float32 PCM, given in pieces, into one stream of ``fmt``.

    ``write()`` returns the bytes that are ready (possibly none: codecs hold back a frame or
    two), ``finish()`` the rest, trailer included. ``close()`` releases the encoder without
    finishing, for a client that went away. One instance serves one response; calls must not
    overlap (the speech route makes them one after another, on worker threads).
    """

    def __init__(self, fmt: str):
        if fmt not in FORMATS:
            raise ValueError(f"unknown audio format {fmt!r}")
        self.format = FORMATS[fmt]
        self._av = _import_av()
        self._sink = _Sink()
        self._resampler: Any = None
        self._in_rate: int | None = None
        self._in_samples = 0
        self.samples = 0               # samples at OUTPUT_RATE handed to the codec so far
        self._container: Any = None
        self._stream: Any = None
        self._done = False
        if self.format.container:
            self._open_container()

    @property
    def duration(self) -> float:
        """Seconds of audio encoded so far."""
        return self.samples / OUTPUT_RATE

    def _open_container(self) -> None:
        av = self._av
        f = self.format
        self._container = av.open(self._sink, mode="w", format=f.container, container_options=f.options)
        # Each packet goes out as soon as it is muxed, instead of waiting in a 32 KiB I/O buffer:
        # that buffer would hold back the first second or so of compressed audio.
        self._container.flags |= av.container.Flags.flush_packets.value
        # bitexact keeps FFmpeg's version out of the file (WAV then has the plain 44-byte header).
        self._container.flags |= av.container.Flags.bitexact.value
        self._stream = self._container.add_stream(f.codec, rate=OUTPUT_RATE, layout="mono", options=f.codec_options)
        if f.bit_rate:
            self._stream.bit_rate = f.bit_rate
        # Write the header now, so that even an empty stream is a valid file.
        self._container.start_encoding()

    def write(self, pcm: np.ndarray, sample_rate: int) -> bytes:
        if self._done:
            raise RuntimeError("the encoder is finished")
        pcm = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        if pcm.size == 0:
            return self._sink.take()
        if self._resampler is None:
            # Raw pcm leaves the resampler as 16-bit samples; codecs take float and convert
            # to their own sample format (and frame size) themselves.
            self._resampler = self._av.AudioResampler(
                format="flt" if self._container else "s16", layout="mono", rate=OUTPUT_RATE)
            self._in_rate = sample_rate
        elif sample_rate != self._in_rate:
            raise ValueError(f"sample rate changed from {self._in_rate} to {sample_rate} within one stream")
        frame = self._av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = sample_rate
        frame.pts = self._in_samples
        frame.time_base = Fraction(1, sample_rate)
        self._in_samples += pcm.size
        self._encode(self._resampler.resample(frame))
        return self._sink.take()

    def finish(self) -> bytes:
        """The remaining bytes; the stream is complete after them."""
        if self._done:
            return b""
        try:
            if self._resampler is not None:
                self._encode(self._resampler.resample(None))
            if self._container is not None:
                self._container.mux(self._stream.encode(None))
        finally:
            self.close()
        return self._sink.take()

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        if self._container is not None:
            self._container.close()

    def _encode(self, frames: list[Any]) -> None:
        for frame in frames:
            self.samples += frame.samples
            if self._container is None:
                self._sink.write(frame.to_ndarray().astype("<i2", copy=False).tobytes())
            else:
                self._container.mux(self._stream.encode(frame))


def encode(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The whole of ``pcm`` as one file of ``fmt``."""
    enc = StreamEncoder(fmt)
    try:
        return enc.write(pcm, sample_rate) + enc.finish()
    finally:
        enc.close()
