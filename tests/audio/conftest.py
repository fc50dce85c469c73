"""What the audio tests of clients that leave share: a watch on a server that says when it has
seen a client go, and a client that hangs up at a given moment.

With them a test orders what happens by events (the server has begun a piece of work; it has
seen the client go; it is done with the request) instead of by time, so it holds however fast or
loaded the machine is: no read timeout that must expire at the right moment, no quiet period
that must pass to show that nothing more happens."""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable

import httpx
import pytest

WAIT_S = 120   # what a test waits at most for an event that is due (only a failing test waits this long)


class Leaving:
    """Watches the requests of one server whose client goes away.

    ``left`` is set when the server's receive() tells it that a client has gone. The server's code
    that stops the work on that (the watch of until_disconnect, a streamed response's listener)
    runs on in the same step of the event loop, so it is done before anything that a test starts
    on another thread once it sees ``left`` can reach the event loop. ``over`` is set once the
    server is done with such a request (its response sent or dropped, its place in line given
    back), and ``statuses`` has the status the server answered each of them with."""

    def __init__(self) -> None:
        self.left = threading.Event()
        self.over = threading.Event()
        self.statuses: list[int | None] = []

    def around(self, app: Callable[..., Any]) -> Callable[..., Any]:
        async def watched(scope: dict, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            gone, status = False, None

            async def receive_watched() -> dict:
                nonlocal gone
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone = True
                    self.left.set()
                return message

            async def send_watched(message: dict) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await app(scope, receive_watched, send_watched)
            finally:
                if gone:
                    self.statuses.append(status)
                    self.over.set()
        return watched


@pytest.fixture
def leaving(monkeypatch) -> Callable[[Any], Leaving]:
    """``leaving(server)``: a Leaving watch on that server's app for this test."""
    def watch(server: Any) -> Leaving:
        app = server.app
        stack = app.middleware_stack or app.build_middleware_stack()
        watching = Leaving()
        monkeypatch.setattr(app, "middleware_stack", watching.around(stack))
        return watching
    return watch


@pytest.fixture
def hang_up() -> Callable[..., None]:
    """``hang_up(url, when, **request)``: a client that sends a POST (httpx.Request's arguments:
    json=, files=, data=) on a connection of its own, reads nothing, and closes the connection
    once ``when`` is set (it fails if that never happens)."""
    def post_and_hang_up(url: str, when: threading.Event, **request: Any) -> None:
        req = httpx.Request("POST", url, **request)
        body = req.read()
        head = f"POST {req.url.raw_path.decode()} HTTP/1.1\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in req.headers.items()) + "\r\n"
        with socket.create_connection((req.url.host, req.url.port), timeout=WAIT_S) as conn:
            conn.sendall(head.encode() + body)
            assert when.wait(WAIT_S), "the server never began the work the client was to leave during"
    return post_and_hang_up
