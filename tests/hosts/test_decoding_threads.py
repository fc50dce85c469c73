"""The embedded host's decoding threads: an idle model keeps none.

llama.cpp built with OpenMP keeps a pool of worker threads for each thread that decoded with more
than one thread, for as long as that thread lives. With two pools in one process (two models loaded,
each with a decoding thread of its own), libgomp counts more threads than CPUs and makes every
barrier of every decode sleep instead of spin: one model's stream went from 10.0 to 18.7 ms a token
on two cores once the other had answered a request. So a model's decoding thread ends once it has
been idle a moment (its pool with it), and the next request starts another
(llamacpp/batch.Scheduler.IDLE_EXIT)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from openai_ext.hosts.base import Prompt
from openai_ext.hosts.files import default_gguf
from openai_ext.hosts.llamacpp import LlamaCppHost
from openai_ext.hosts.llamacpp.batch import Scheduler
from openai_ext.hosts.request import GenerationSettings

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads threads off /proc (Linux)")]

GREEDY = GenerationSettings(max_new_tokens=8, temperature=0.0)


def os_threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def answer(host: LlamaCppHost, text: str) -> str:
    rendered = host.chat_prompt([{"role": "user", "content": text}]).text
    return "".join(p.text for p in host.generate(Prompt(rendered, host.tokenize(rendered)), GREEDY, threading.Event()))


def test_an_idle_model_keeps_no_decoding_threads_and_answers_again(monkeypatch):
    monkeypatch.setattr(Scheduler, "IDLE_EXIT", 0.2)
    # two threads each, whatever this machine has: each decoding thread gets a pool
    hosts = [LlamaCppHost(default_gguf(), n_ctx=2048, parallel=2, speculation="off", n_threads=2) for _ in range(2)]
    try:
        before = os_threads()
        first = [answer(host, "Say hello.") for host in hosts]
        assert all(first)
        deadline = time.monotonic() + 60   # (a watchdog: the threads end once idle for IDLE_EXIT)
        while (left := os_threads() - before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"threads left by idle models: {sorted(left)}"
        # and a request starts a thread again: the same answers
        assert [answer(host, "Say hello.") for host in hosts] == first
        for host in hosts:
            assert host.batch_stats()["running"] == 0
    finally:
        for host in hosts:
            host.close()
