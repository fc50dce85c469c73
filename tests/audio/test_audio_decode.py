"""Decoding uploads to float32 mono 16 kHz: every OpenAI upload format, and every way a file can
be wrong. The files are encoded here with PyAV (FFmpeg's real encoders)."""

from __future__ import annotations

import io
import sys
import wave

import av
import numpy as np
import pytest

from openai_ext.audio import decode as audio_decode
from openai_ext.audio.decode import decode
from openai_ext.core.errors import (
    InvalidRequestError,
    RequestTooLargeError,
    ServiceUnavailableError,
)

pytestmark = pytest.mark.engines

# extension -> (container, codec, codec sample rate or None for the source's). mpga is MPEG audio
# layer 3 under another name; mpeg is an MPEG program stream (here with MP2 audio).
FORMATS = {
    "flac": ("flac", "flac", None),
    "mp3": ("mp3", "libmp3lame", None),
    "mp4": ("mp4", "aac", None),
    "mpeg": ("mpeg", "mp2", None),
    "mpga": ("mp3", "libmp3lame", None),
    "m4a": ("ipod", "aac", None),
    "ogg": ("ogg", "libopus", 48000),
    "wav": ("wav", "pcm_s16le", None),
    "webm": ("webm", "libopus", 48000),
}
MIME = {"flac": "audio/flac", "mp3": "audio/mpeg", "mp4": "audio/mp4", "mpeg": "audio/mpeg", "mpga": "audio/mpeg",
        "m4a": "audio/mp4", "ogg": "audio/ogg", "wav": "audio/wav", "webm": "audio/webm"}


def encode(samples: np.ndarray, rate: int, ext: str, channels: int = 1) -> bytes:
    """``samples`` (float32 mono) as a file of the given type, in memory."""
    container, codec, codec_rate = FORMATS[ext]
    layout = "mono" if channels == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=codec_rate or rate, layout=layout)
        data = np.tile(samples.astype(np.float32), (channels, 1)) if channels > 1 else samples[None, :]
        step = 4096
        for i in range(0, data.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data[:, i:i + step]), format="fltp",
                                               layout=layout)
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def tone(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("ext", sorted(FORMATS))
def test_every_upload_format_decodes_to_16k_mono(ext):
    out = decode(encode(tone(2.0, 22050), 22050, ext))
    assert out.dtype == np.float32 and out.ndim == 1
    # lossy codecs add a few ms of padding at either end
    assert abs(out.size / 16000 - 2.0) < 0.1, out.size / 16000
    # the tone survives: its frequency is still the loudest
    spectrum = np.abs(np.fft.rfft(out[4000:20000]))
    assert abs(np.argmax(spectrum) * 16000 / 16000 - 440) < 5
    assert 0.3 < np.max(np.abs(out)) < 0.7


def test_stereo_and_other_rates_are_mixed_down_and_resampled():
    out = decode(encode(tone(1.5, 44100, 1000.0), 44100, "flac", channels=2))
    assert out.ndim == 1 and abs(out.size - 24000) < 50
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 16000 / out.size - 1000) < 5


def test_other_target_rate():
    assert abs(decode(encode(tone(1.0, 22050), 22050, "wav"), rate=8000).size - 8000) < 10


def _invalid(data: bytes) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as e:
        decode(data)
    assert e.value.param == "file" and e.value.status == 400
    return e.value


def test_empty_file():
    assert "empty" in _invalid(b"").message


@pytest.mark.parametrize("data", [b"hello, this is not audio at all", bytes(range(256)) * 40,
                                  b"\x00" * 5000, b'{"text": "json"}'])
def test_not_audio(data):
    err = _invalid(data)
    assert err.code == "invalid_audio" and "could not be read as audio" in err.message


def test_corrupt_header():
    data = bytearray(encode(tone(1.0, 22050), 22050, "flac"))
    data[:64] = b"\xff" * 64
    _invalid(bytes(data))


def test_video_without_sound_is_refused():
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i in range(5):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), i * 40, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    assert "no audio track" in _invalid(buf.getvalue()).message


def test_wav_without_samples():
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(b"")
    data = buf.getvalue()
    assert len(data) == 44   # a valid header, and nothing after it
    assert "no audio samples" in _invalid(data).message


def test_cut_off_file_keeps_the_audio_before_the_cut():
    data = encode(tone(4.0, 22050), 22050, "mp3")
    out = decode(data[:len(data) // 2])
    assert 1.5 < out.size / 16000 < 2.5


def test_damage_in_the_middle_is_skipped():
    data = bytearray(encode(tone(4.0, 22050), 22050, "mp3"))
    middle = len(data) // 2
    data[middle:middle + 2000] = np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8).tobytes()
    out = decode(bytes(data))
    assert out.size / 16000 > 3.0


def test_audio_longer_than_the_limit():
    with pytest.raises(RequestTooLargeError) as e:
        decode(encode(tone(3.0, 16000), 16000, "wav"), max_seconds=2)
    assert e.value.status == 413 and e.value.param == "file" and e.value.code == "audio_too_long"


def test_without_pyav_the_error_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ServiceUnavailableError) as e:
        decode(b"RIFF....WAVE")
    assert "pip install av" in e.value.message and e.value.headers == {"x-should-retry": "false"}


def test_module_needs_no_heavy_imports():
    # the core imports it at start; PyAV and numpy load only when a file is decoded
    assert "av" not in vars(audio_decode) and "np" not in vars(audio_decode)
