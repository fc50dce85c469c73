"""A chat stream's plain text chunks are written from a head and a tail made once per stream
(text/render.ContentFrames): byte for byte what the whole chunk, built and encoded, gives."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from openai_ext.core.streaming import Framed, OpenAIFraming
from openai_ext.text import render

TEXTS = ["", "Hello", " world", 'a "quoted" \\ back', "line\nbreak\ttab\r", "\x00\x1f\x7f control",
         "éà ünïcödé", "日本語", "emoji 🦊 fox", "</think>", "data: [DONE]\n\n", "{\"x\": 1}"]


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("model", ["SmolLM2-135M-Instruct.Q4_1", 'odd "model" é/名'])
def test_a_content_frame_is_the_whole_chunk_framed(include_usage, model):
    job = SimpleNamespace(id="chatcmpl-0123456789abcdef01234567", created=1795959053, model=model)
    frames = render.ContentFrames(job, "fp_4dd83d3ae6", include_usage=include_usage)
    framing = OpenAIFraming()
    rng = random.Random(5)
    texts = TEXTS + ["".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(1, 12))) for _ in range(200)]
    for index in (0, 1, 7, 12):
        for text in texts:
            quick = frames.frame(index, text)
            whole = framing.frame(render.chat_chunk(job, "fp_4dd83d3ae6", [render.chat_chunk_choice(
                index, {"content": text})], include_usage=include_usage))
            assert type(quick) is Framed and bytes(quick) == whole
            assert framing.frame(quick) is quick   # sent as it is
            body = json.loads(quick.removeprefix(b"data: "))
            assert body["choices"][0]["delta"] == {"content": text} and ("usage" in body) is include_usage
