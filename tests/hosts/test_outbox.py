"""The embedded host's outbox: pieces from the scheduler's thread to a reader thread or straight
to the event loop (llamacpp/outbox.py), and the server reading the real host in the loop."""

from __future__ import annotations

import asyncio
import threading

import anyio
import pytest

from openai_ext.hosts.base import Prompt
from openai_ext.hosts.llamacpp.outbox import END, Outbox
from openai_ext.hosts.request import GenerationSettings


def test_the_loop_is_woken_for_each_piece_in_order():
    async def main():
        box = Outbox()
        started = threading.Event()

        def produce():
            started.wait()
            for i in range(200):
                box.put(i)
            box.put(END)
        thread = threading.Thread(target=produce)
        thread.start()
        got = []
        started.set()
        while (item := await box.aget()) is not END:
            got.append(item)
        thread.join()
        return got
    assert asyncio.run(main()) == list(range(200))


def test_a_reader_cancelled_while_it_waits_loses_nothing():
    async def main():
        box = Outbox()
        with anyio.move_on_after(0.01) as scope:
            await box.aget()   # nothing comes: cancelled while its wake-up is registered
        assert scope.cancelled_caught
        box.put("a")           # (wakes a reader that is gone: nothing happens)
        box.put("b")
        return [await box.aget(), await box.aget(), box.qsize()]
    assert asyncio.run(main()) == ["a", "b", 0]


def test_a_piece_put_after_its_loop_closed_waits_for_a_thread_reader():
    loop = asyncio.new_event_loop()
    box = Outbox()
    task = loop.create_task(box.aget())
    loop.run_until_complete(asyncio.sleep(0))   # the reader now waits in a loop ...
    task.cancel()
    loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    loop.close()                                # ... that has gone away
    box.put("piece")                            # must not raise on the scheduler's thread
    assert box.get() == "piece"


@pytest.mark.slow
def test_the_server_reads_the_embedded_host_in_the_event_loop(llama_host, client, monkeypatch):
    """No worker thread sits between the batch and a client: the server never calls the blocking
    ``generate``, and streamed and whole answers are the host's own."""
    def blocking(*args, **kwargs):
        raise AssertionError("the server read the embedded host through a worker thread")
    prompt = llama_host.chat_prompt([{"role": "user", "content": "Count to five."}])
    own = "".join(p.text for p in llama_host.generate(Prompt(prompt.text, llama_host.tokenize(prompt.text)),
                                                      GenerationSettings(max_new_tokens=12, temperature=0.0),
                                                      threading.Event()))
    monkeypatch.setattr(llama_host, "generate", blocking)
    ask = {"model": "x", "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12,
           "temperature": 0}
    whole = client.chat.completions.create(**ask)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**ask, stream=True)
                       if c.choices)
    assert whole.choices[0].message.content == own == streamed
    assert whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"
