"""The README's first command, as a user runs it: `python -m openai_ext` in a process of its own,
serving chat, completions and four concurrent streams to the end, and still alive after them.

It runs on this machine's CPU as it is, and on a stand-in for a CPU whose llama.cpp AMX path
crashes (tests/doubles/amx_cpu): there the default settings find that out in a child process and
serve without the extra buffer types, `--repack off` forces that, and `--repack on` shows the crash
the others avoid. So the test protects users whatever CPU it runs on."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest
from support import DOUBLES, processes
from support.processes import Served, stop
from support.servers import openai_client
from support.spec import assert_valid

pytestmark = pytest.mark.slow

AMX_CPU = DOUBLES / "amx_cpu"


def serve(tmp_path, *flags: str, amx_cpu: bool = False):
    return processes.serve(tmp_path, *flags, path=[str(AMX_CPU)] if amx_cpu else [])


async def one_stream(client: httpx.AsyncClient, url: str, i: int) -> tuple[int, bool]:
    body = {"model": "x", "stream": True, "max_tokens": 32, "temperature": 0, "ban_eos_token": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Write a long story, number {i}."}]}
    usage, done = None, False
    async with client.stream("POST", f"{url}/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                assert_valid("CreateChatCompletionStreamResponse", chunk)
                usage = chunk.get("usage") or usage
    return usage["completion_tokens"], done


async def four_streams(url: str) -> list[tuple[int, bool]]:
    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(*(one_stream(client, url, i) for i in range(4)))


def assert_serves_everything(served: Served) -> None:
    client = openai_client(served, timeout=300)
    chat = client.chat.completions.with_raw_response.create(
        model="x", max_tokens=24, temperature=0, messages=[{"role": "user", "content": "Tell me about the sea."}],
        extra_body={"ban_eos_token": True})
    assert_valid("CreateChatCompletionResponse", chat.http_response.json())
    assert chat.parse().usage.completion_tokens == 24 and chat.parse().choices[0].finish_reason == "length"
    completion = client.completions.with_raw_response.create(model="x", prompt="Once upon a time", max_tokens=24,
                                                             temperature=0, extra_body={"ban_eos_token": True})
    assert_valid("CreateCompletionResponse", completion.http_response.json())
    assert completion.parse().usage.completion_tokens == 24
    assert asyncio.run(four_streams(served.url)) == [(32, True)] * 4
    assert served.proc.poll() is None, served.output()      # alive after all of it


def test_the_server_serves_at_default_settings_on_this_cpu(tmp_path):
    served = serve(tmp_path)
    try:
        assert_serves_everything(served)
        assert "extra CPU buffer types" in served.output()    # one line says what was chosen and why
    finally:
        stop(served)


def test_on_a_cpu_whose_amx_path_crashes_the_default_finds_out_and_serves(tmp_path):
    served = serve(tmp_path, amx_cpu=True)
    try:
        assert_serves_everything(served)
        out = served.output()
        assert "extra CPU buffer types (weight repacking, AMX): off" in out and "SIGSEGV" in out, out
    finally:
        stop(served)
    # the next start remembers the verdict instead of testing again
    again = serve(tmp_path, amx_cpu=True)
    try:
        assert "kept from an earlier start" in again.output()
        assert_serves_everything(again)
    finally:
        stop(again)


def test_on_such_a_cpu_repack_off_serves_and_repack_on_dies_as_the_cpu_does(tmp_path):
    safe = serve(tmp_path, "--repack", "off", amx_cpu=True)
    try:
        assert "forced by the repack setting ('off')" in safe.output()
        assert_serves_everything(safe)
    finally:
        stop(safe)
    forced = serve(tmp_path, "--repack", "on", amx_cpu=True)
    try:
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{forced.url}/chat/completions", timeout=120,
                       json={"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert forced.proc.wait(timeout=60) == -signal.SIGSEGV
    finally:
        stop(forced)
