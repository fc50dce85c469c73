"""A spoken turn through /v1/realtime: from the end of the user's speech to the first audio of
the answer, with the stages in between.

The server (python -m openai_ext, in a separate process, default models) is driven by the openai
SDK's realtime client in push-to-talk mode: a short question, synthesized here with the piper
voice, is appended; the clock starts when ``input_audio_buffer.commit`` is sent, and
``response.create`` follows at once. Measured from the commit, each round:

  transcript     conversation.item.input_audio_transcription.completed (Whisper is done)
  first token    the first response.output_audio_transcript.delta (the model's first text)
  first audio    the first response.output_audio.delta (speech of the first sentence)

plus the end of the answer (response.done). The first round loads the models and is left out.
Goal: first audio within 1.0 s (median) on a 2-core machine.

    python bench/bench_realtime.py [--rounds 5] [--question "What is the capital of France?"]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
from pathlib import Path

import openai
from serving import free_port, start_api, stop, wait_up

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STAGES = ("transcript", "first token", "first audio", "done")
WHEN = {"conversation.item.input_audio_transcription.completed": "transcript",
        "response.output_audio_transcript.delta": "first token",
        "response.output_audio.delta": "first audio", "response.done": "done"}


def speech(text: str) -> bytes:
    from openai_ext.audio.speech import render
    from openai_ext.audio.tts import load_engine
    from openai_ext.core.config import Settings

    tts = load_engine(Settings())
    return render(tts, text, tts.default_voice, fmt="pcm")


def one_turn(connection, pcm: bytes) -> dict[str, float]:
    for at in range(0, len(pcm), 9600):
        connection.input_audio_buffer.append(audio=base64.b64encode(pcm[at:at + 9600]).decode())
    started = time.perf_counter()
    connection.input_audio_buffer.commit()
    connection.response.create()
    seen: dict[str, float] = {}
    while "done" not in seen:
        event = json.loads(connection.recv_bytes())
        if event["type"] == "error":
            raise SystemExit(f"error event: {event['error']}")
        stage = WHEN.get(event["type"])
        if stage is not None and stage not in seen:
            seen[stage] = time.perf_counter() - started
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--question", default="What is the capital of France?")
    args = parser.parse_args()
    pcm = speech(args.question)
    port = free_port()
    proc = start_api(port)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        wait_up(base, proc)
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        rows = []
        for n in range(args.rounds + 1):
            with client.realtime.connect(model="gpt-realtime") as connection:
                connection.recv_bytes()   # session.created
                connection.session.update(session={
                    "type": "realtime", "instructions": "Answer in one short sentence.", "max_output_tokens": 40,
                    "audio": {"input": {"turn_detection": None}}})
                connection.recv_bytes()   # session.updated
                seen = one_turn(connection, pcm)
            if n:
                rows.append(seen)
            print(("warm-up " if not n else f"round {n}  ") +
                  "  ".join(f"{s} {seen.get(s, float('nan')):.3f}s" for s in STAGES), flush=True)
        print(f"\nmedian over {len(rows)} rounds, from the commit "
              f"({len(pcm) / 48_000:.1f} s question):")
        for stage in STAGES:
            values = [r[stage] for r in rows if stage in r]
            print(f"  {stage:<12} {statistics.median(values):.3f} s")
    finally:
        stop([proc])


if __name__ == "__main__":
    main()
