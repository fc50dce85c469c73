"""The speech encoder (openai_ext/audio_encode.py): every format decoded back with PyAV."""

from __future__ import annotations

import io
import struct
import sys

import av
import numpy as np
import pytest

from openai_ext.audio.encode import (
    FORMATS,
    OUTPUT_RATE,
    StreamEncoder,
    content_type,
    encode,
)
from openai_ext.core.errors import ServiceUnavailableError

pytestmark = pytest.mark.engines

IN_RATE = 22_050   # piper's rate: every format must come out at 24 kHz all the same
TONE_HZ = 440.0
CONTAINERS = ["mp3", "opus", "aac", "flac", "wav"]
EXPECTED_CODEC = {"mp3": "mp3", "opus": "opus", "aac": "aac", "flac": "flac", "wav": "pcm_s16le"}


def tone(seconds: float, rate: int = IN_RATE, hz: float = TONE_HZ, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def decode(data: bytes) -> tuple[np.ndarray, int, int, str]:
    """Samples (as float, first channel), sample rate, channel count and codec of an encoded file."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = list(container.decode(stream))
        codec = stream.codec_context.codec.canonical_name
    rate, channels = frames[0].sample_rate, frames[0].layout.nb_channels
    to_float = av.AudioResampler(format="fltp", rate=rate)   # planar float, same layout and rate
    pcm = [f.to_ndarray()[0] for frame in frames for f in to_float.resample(frame)]
    pcm += [f.to_ndarray()[0] for f in to_float.resample(None)]
    return np.concatenate(pcm).astype(np.float32), rate, channels, codec


def dominant_hz(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.fft.rfftfreq(len(pcm), 1 / rate)[np.argmax(spectrum)])


def opus_input_rate(data: bytes) -> int:
    """The original sample rate an Ogg Opus file records in its OpusHead (decoders play it at 48 kHz)."""
    head = data.index(b"OpusHead")
    return struct.unpack("<I", data[head + 12:head + 16])[0]


def stream_in_pieces(fmt: str, pcm: np.ndarray, pieces: int = 3) -> list[bytes]:
    enc = StreamEncoder(fmt)
    out = [enc.write(part, IN_RATE) for part in np.array_split(pcm, pieces)]
    return out + [enc.finish()]


@pytest.mark.parametrize("fmt", CONTAINERS)
def test_each_container_format_decodes_at_24k_mono_with_the_same_tone(fmt):
    pcm = tone(1.5)
    data = b"".join(stream_in_pieces(fmt, pcm))
    decoded, rate, channels, codec = decode(data)
    assert codec == EXPECTED_CODEC[fmt]
    assert channels == 1
    if fmt == "opus":
        assert rate == 48_000 and opus_input_rate(data) == OUTPUT_RATE   # Opus always decodes at 48 kHz
    else:
        assert rate == OUTPUT_RATE
    # lossy codecs add their priming samples; nothing may be lost
    assert 1.5 - 0.01 <= len(decoded) / rate <= 1.5 + 0.12
    assert abs(dominant_hz(decoded, rate) - TONE_HZ) < 5
    level = float(np.sqrt(np.mean(decoded ** 2)))
    assert 0.15 < level < 0.3   # a 0.3 sine has an RMS of 0.21


def test_pcm_is_raw_24k_16bit_little_endian_mono():
    pcm = tone(1.0)
    data = b"".join(stream_in_pieces("pcm", pcm))
    assert len(data) % 2 == 0
    samples = np.frombuffer(data, "<i2").astype(np.float32) / 32768
    assert len(samples) == pytest.approx(OUTPUT_RATE, abs=2)        # exactly one second at 24 kHz
    assert abs(dominant_hz(samples, OUTPUT_RATE) - TONE_HZ) < 2
    assert np.max(np.abs(samples)) == pytest.approx(0.3, abs=0.01)


def test_wav_has_the_plain_streaming_header():
    data = encode(tone(0.5), IN_RATE, "wav")
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVE" + b"fmt "
    fmt_tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", data[20:36])
    assert (fmt_tag, channels, rate, bits) == (1, 1, OUTPUT_RATE, 16)
    # sizes are unknown while streaming: the 0xFFFFFFFF convention, samples right after 44 bytes
    assert data[36:40] == b"data" and data[40:44] == b"\xff\xff\xff\xff"
    assert len(data) - 44 == pytest.approx(OUTPUT_RATE, abs=4)       # 0.5 s of 16-bit samples


def test_flac_streaminfo_records_24k_mono_16bit():
    data = encode(tone(0.5), IN_RATE, "flac")
    assert data[:4] == b"fLaC"
    info = int.from_bytes(data[18:26], "big")      # STREAMINFO: rate(20) channels-1(3) bits-1(5) samples(36)
    assert info >> 44 == OUTPUT_RATE and (info >> 41) & 7 == 0 and (info >> 36) & 31 == 15


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_bytes_come_out_before_the_stream_ends(fmt):
    """Streaming needs every format to give bytes for the first second before it is finished."""
    chunks = stream_in_pieces(fmt, tone(3.0))
    assert len(chunks[0]) > 1000, "the first second produced no bytes"
    assert sum(len(c) for c in chunks[:-1]) > 0.8 * sum(len(c) for c in chunks)


@pytest.mark.parametrize("fmt", CONTAINERS)
def test_pieces_and_one_shot_give_the_same_length(fmt):
    pcm = tone(2.0)
    pieces, _, _, _ = decode(b"".join(stream_in_pieces(fmt, pcm, pieces=7)))
    whole, _, _, _ = decode(encode(pcm, IN_RATE, fmt))
    assert len(pieces) == len(whole)


def test_content_types():
    assert {f: content_type(f) for f in FORMATS} == {
        "mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
        "wav": "audio/wav", "pcm": "audio/pcm"}


def test_no_samples_still_make_a_valid_file():
    assert encode(np.zeros(0, np.float32), IN_RATE, "pcm") == b""
    data = encode(np.zeros(0, np.float32), IN_RATE, "wav")
    assert len(data) == 44
    with av.open(io.BytesIO(data)) as container:
        assert sum(f.samples for f in container.decode(audio=0)) == 0


def test_duration_counts_encoded_samples():
    enc = StreamEncoder("mp3")
    enc.write(tone(1.0), IN_RATE)
    enc.finish()
    assert enc.duration == pytest.approx(1.0, abs=0.01)


def test_misuse_is_refused():
    with pytest.raises(ValueError, match="unknown audio format"):
        StreamEncoder("ogg")
    enc = StreamEncoder("wav")
    enc.write(tone(0.1), IN_RATE)
    with pytest.raises(ValueError, match="sample rate changed"):
        enc.write(tone(0.1, rate=16_000), 16_000)
    enc.finish()
    with pytest.raises(RuntimeError, match="finished"):
        enc.write(tone(0.1), IN_RATE)
    assert enc.finish() == b""


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_close_without_finish_ends_the_encoder_for_good(fmt):
    """The speech route closes its encoder on every path (a client that left, a failure): close
    is idempotent, ends the stream (nothing more is written or flushed), and the encoder's
    container is gone with it."""
    enc = StreamEncoder(fmt)
    enc.write(tone(0.3), IN_RATE)
    enc.close()
    enc.close()   # twice is harmless
    with pytest.raises(RuntimeError, match="finished"):
        enc.write(tone(0.1), IN_RATE)
    assert enc.finish() == b""


def test_without_pyav_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)   # what an environment without PyAV looks like
    with pytest.raises(ServiceUnavailableError, match="pip install av"):
        StreamEncoder("mp3")
