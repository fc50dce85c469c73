"""Serving the app with uvicorn: in the foreground (standalone) or on a daemon thread (extension).

The listening socket is bound here, before uvicorn starts, so a taken port is reported in one
clear line instead of a traceback, and port 0 gives a free port (the tests use that).
"""

from __future__ import annotations

import errno
import logging
import socket
import sys
import threading
import time

import uvicorn
from fastapi import FastAPI

from .config import Settings

log = logging.getLogger(__name__)


class PortInUse(RuntimeError):
    pass


def bind_address(settings: Settings) -> str:
    return settings.listen_host if settings.listen else "127.0.0.1"


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets that
    # do, and with it on, each small stream chunk would wait for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise PortInUse(
                f"Port {port} on {host} is already in use (or not allowed). Choose another port with "
                f"--port N, the OPENEDAI_PORT environment variable, or the 'port' setting.") from None
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class ApiServer:
    def __init__(self, app: FastAPI, settings: Settings):
        self.app = app
        self.settings = settings
        self.host = bind_address(settings)
        self.sock = bind_socket(self.host, settings.port)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="info" if settings.debug else "warning",
                                access_log=settings.debug, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/v1"

    def serve_forever(self) -> None:
        self.server.run(sockets=[self.sock])

    def start(self, timeout: float = 30.0) -> "ApiServer":
        """Starts serving on a daemon thread and returns once requests are accepted."""
        self.thread = threading.Thread(target=self.serve_forever, name="openai-api", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("The API server did not start; see the log above.")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.sock.close()


def announce(server: ApiServer) -> None:
    print(f"OpenAI-compatible API at {server.url}  (set OPENAI_BASE_URL to this)", file=sys.stderr, flush=True)
