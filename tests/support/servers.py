"""Clients of the servers the fixtures start, and servers a test starts and stops itself."""

from __future__ import annotations

import socket
import threading
import time


def openai_client(server, **kw):
    from openai import OpenAI

    return OpenAI(base_url=server.url, api_key=kw.pop("api_key", "dummy"), max_retries=0,
                  _strict_response_validation=True, timeout=kw.pop("timeout", 120), **kw)


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_ipv6_loopback() -> bool:
    """Whether this machine can bind ::1 (some containers have no IPv6)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def idle(server, host, timeout: float = 10.0) -> bool:
    """Whether the server's line and its host come to rest (nothing running, waiting or held)
    within ``timeout``: a cut stream or a failed request must leave nothing behind."""
    state = server.app.state.api
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not state.text.queue.running and not state.text.queue.waiting and host.idle():
            return True
        time.sleep(0.01)
    return False


def wait_until(check, what: str, tries: int = 200):
    """Polls until ``check()`` holds: progress is asserted, never a duration."""
    for _ in range(tries):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def run_together(work, n: int) -> None:
    """Runs ``work(0)`` ... ``work(n - 1)`` on ``n`` threads at once and waits for all; a failure
    in any of them fails the caller, after every thread has ended."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def start_server(host, **settings):
    """An API server on a free port around ``host``, outside the fixtures (a test that stops it,
    or starts several on one store); the caller stops it."""
    from openai_ext.app import create_app
    from openai_ext.core.config import Settings
    from openai_ext.core.server import ApiServer

    s = Settings(port=0, **settings)
    return ApiServer(create_app(s, host), s).start()
