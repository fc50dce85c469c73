"""Shutting down while clients are mid-stream: each open stream ends with an error event and
[DONE] (a clean end of the chunked body), short requests finish, new ones are not taken."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import anyio
import httpx
import pytest
from sse_starlette.sse import AppStatus
from support import ROOT
from support.scripted import held
from support.spec import assert_valid, parse_sse

# (no end-of-text token: the stream is still running whenever the test stops the server)
LONG = {"model": "x", "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500, "temperature": 1, "seed": 3, "stream": True, "ban_eos_token": True}


def read_until_chunks(response: httpx.Response, n: int) -> tuple[str, object]:
    """Reads the stream until n chunks have come; returns the text so far and the line iterator."""
    lines = response.iter_lines()
    raw, seen = [], 0
    for line in lines:
        raw.append(line)
        if line.startswith("data: {"):
            seen += 1
            if seen >= n:
                break
    return "\n".join(raw) + "\n", lines


def finish(raw: str, lines) -> tuple[list, bool]:
    rest = "\n".join(lines)   # raises if the body is cut without its last chunk
    return parse_sse(raw + rest)


def test_stopping_the_server_ends_open_streams_with_an_error_event_and_done(script, make_server):
    script.script(held(at=5))   # five tokens, then the stream runs on until the server stops
    server = make_server(script, shutdown_grace_s=5)
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{server.url}/chat/completions",
                                                           json=LONG) as response:
        assert response.status_code == 200
        raw, lines = read_until_chunks(response, 3)
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        events, done = finish(raw, lines)
        stopper.join(30)
    assert done, "the stream must end with [DONE]"
    *chunks, last = events
    for chunk in chunks:
        assert_valid("CreateChatCompletionStreamResponse", chunk)
    assert last["error"]["code"] == "server_shutting_down" and last["error"]["type"] == "server_error"
    assert not stopper.is_alive()
    # no new connections once stopped
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/models", timeout=5)


def test_a_stream_whose_work_stops_slowly_still_ends_cleanly_within_the_grace(script, make_server):
    """A stream first stops its work, then sends its closing event: where a step runs on for
    seconds (a large model on a CPU), the stream is still given the server's grace to end, not
    the 2 s sse-starlette gives by default."""
    script.script(held(at=5, stop_takes=3.0))
    server = make_server(script, shutdown_grace_s=10)

    def as_a_signal_does():
        # what SIGTERM's handler runs (sse-starlette watches for it process-wide), then the stop
        server.server.handle_exit(signal.SIGTERM, None)
        server.stop()
    try:
        with httpx.Client(timeout=60) as client, client.stream("POST", f"{server.url}/chat/completions",
                                                               json=LONG) as response:
            raw, lines = read_until_chunks(response, 3)
            stopper = threading.Thread(target=as_a_signal_does)
            stopper.start()
            events, done = finish(raw, lines)
            stopper.join(30)
    finally:
        AppStatus.should_exit = False   # (process-wide: the other servers of this process run on)
    assert done and events[-1]["error"]["code"] == "server_shutting_down"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow   # starts a process with the model
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_ends_open_streams_cleanly_and_lets_a_short_request_finish(sig):
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # one generation at a time, so the short request waits in line behind the stream
    proc = subprocess.Popen([sys.executable, "-m", "openai_ext", "--port", str(port), "--shutdown-grace-s", "20",
                             "--parallel", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                pytest.fail(proc.stdout.read())
            time.sleep(0.2)
        short: dict = {}

        def plain_request():
            # queued behind the stream; the stream's early end frees the model for it
            short["r"] = httpx.post(f"{base}/chat/completions", timeout=60, json={
                "model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})

        with httpx.Client(timeout=60) as client, client.stream("POST", f"{base}/chat/completions",
                                                               json=LONG) as response:
            raw, lines = read_until_chunks(response, 3)
            waiter = threading.Thread(target=plain_request)
            waiter.start()
            for _ in range(600):   # the plain request is in line behind the stream
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["queued"] >= 1:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the short request never waited in line")
            proc.send_signal(sig)
            try:
                events, done = finish(raw, lines)
            except httpx.TransportError as e:
                proc.wait(60)
                pytest.fail(f"the stream was cut ({e}); the server wrote:\n{proc.stdout.read()}")
        waiter.join(60)
        assert done and events[-1]["error"]["code"] == "server_shutting_down"
        assert short["r"].status_code == 200 and short["r"].json()["choices"][0]["message"]["content"] is not None
        # uvicorn re-raises the signal once it has shut down, so the exit status says which it was
        assert proc.wait(60) in (0, -sig, 130)
        assert "Traceback" not in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stream_waiting_for_its_next_chunk_is_cut_at_the_drain_and_its_task_goes_on():
    """The drain cancels the wait for a chunk (the work under it stops first), and the stream's own
    task is left uncancelled: it still sends its closing event."""
    import asyncio

    from openai_ext.core.errors import ServiceUnavailableError
    from openai_ext.core.streaming import _until_drained

    async def main():
        stopped = []

        async def chunks():
            try:
                yield 1
                await asyncio.Event().wait()   # the model's next token, which never comes
            finally:
                stopped.append("work")

        drained = asyncio.Event()
        got = []
        stream = _until_drained(chunks(), drained)
        asyncio.get_running_loop().call_later(0.01, drained.set)
        with pytest.raises(ServiceUnavailableError):
            async for chunk in stream:
                got.append(chunk)
        await asyncio.sleep(0)   # (a cancellation left pending would be raised here)
        return got, stopped, getattr(asyncio.current_task(), "cancelling", lambda: 0)()   # (Python 3.11+)
    assert asyncio.run(main()) == ([1], ["work"], 0)



def test_a_stream_whose_client_reads_nothing_makes_only_a_few_chunks_ahead():
    """The work runs ahead of its client by at most AHEAD chunks, then waits for it."""
    import asyncio

    from openai_ext.core.streaming import AHEAD, _until_drained

    async def main():
        made = []

        async def chunks():
            for i in range(100):
                made.append(i)
                yield i

        stream = _until_drained(chunks(), asyncio.Event())
        first = await stream.__anext__()
        for _ in range(20):
            await asyncio.sleep(0)   # the client reads nothing more
        ahead = len(made)
        rest = [chunk async for chunk in stream]
        return first, ahead, rest

    first, ahead, rest = asyncio.run(main())
    assert first == 0 and ahead <= AHEAD + 1 and [first, *rest] == list(range(100))


def test_a_client_that_leaves_lets_the_work_finish_its_cleanup():
    """Leaving cancels the stream's own task again at every await (an anyio scope); the work's
    cleanup runs in the work's task, cancelled once, so its awaits (a store write) complete."""
    import asyncio

    from openai_ext.core.streaming import _until_drained

    async def main():
        cleaned = []

        async def chunks():
            try:
                yield 1
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0.01)   # the cleanup's own await, not cut
                cleaned.append("stored")

        async def response():
            with anyio.CancelScope() as scope:
                async with contextlib.aclosing(_until_drained(chunks(), asyncio.Event())) as stream:
                    async for _ in stream:
                        scope.cancel()   # the client left
                        await anyio.sleep(1)
        await response()
        return cleaned

    assert asyncio.run(main()) == ["stored"]
