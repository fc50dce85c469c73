"""Serving the app with uvicorn: in the foreground (standalone) or on a daemon thread (extension).

The listening socket is bound here, before uvicorn starts, so a taken port is reported in one
clear line instead of a traceback, and port 0 gives a free port (the tests use that).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI

from .config import Settings, SettingsError
from .drain import Drain
from .streaming import DROPPED_ON_PURPOSE

log = logging.getLogger(__name__)


SEND_BUFFER = 64 * 1024  # the kernel doubles it for bookkeeping


class PortInUse(RuntimeError):
    pass


# Addresses whose socket answers on 127.0.0.1 ("::" alone is bound dual-stack, see bind_all).
REACHES_LOOPBACK = ("127.0.0.1", "0.0.0.0", "::", "localhost")


def bind_addresses(settings: Settings) -> list[str]:
    """127.0.0.1 unless listening is turned on; with ipv6, its IPv6 counterpart as well.

    The public tunnel always forwards to 127.0.0.1 (flask-cloudflared's fixed target), so with
    the tunnel on that address is bound too when listen_host would leave it out."""
    addresses = [settings.listen_host if settings.listen else "127.0.0.1"]
    if settings.ipv6 and ":" not in addresses[0]:   # an IPv6 listen_host already is the IPv6 socket
        addresses.append("::" if settings.listen else "::1")
    if settings.public_api and not any(a in REACHES_LOOPBACK for a in addresses):
        addresses.append("127.0.0.1")
    return addresses


def bind_socket(host: str, port: int, dual_stack: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets that
    # do, and with it on, each small stream chunk would wait for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # A fixed send buffer (inherited by accepted connections) caps what a client that stops
    # reading can pin in the kernel; left to autotuning it grows to megabytes per connection.
    # With it, the stream's backpressure reaches the generation, which then pauses.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    if family == socket.AF_INET6:
        # Set either way, as the system default varies: dual-stack when no IPv4 socket is bound
        # beside it ("::" then answers IPv4 clients too), else IPv6 only, so both can share the port.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
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


def bind_all(settings: Settings) -> list[socket.socket]:
    """The listening sockets for the settings (PortInUse if the port is taken). Standalone mode
    binds them before loading the model, so a taken port is reported at once."""
    sockets: list[socket.socket] = []
    addresses = bind_addresses(settings)
    dual_stack = all(":" in address for address in addresses)
    try:
        for address in addresses:
            # every address on the same port; port 0 takes the first socket's free port
            port = sockets[0].getsockname()[1] if sockets else settings.port
            sockets.append(bind_socket(address, port, dual_stack))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class _Server(uvicorn.Server):
    """uvicorn's server, which tells open streams when it begins to shut down (core/drain.py)."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.drain.start()
        super().handle_exit(sig, frame)


class ApiServer:
    def __init__(self, app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None):
        self.app = app
        self.settings = settings
        self.host = bind_addresses(settings)[0]
        self.sockets = sockets if sockets is not None else bind_all(settings)
        self.port = self.sockets[0].getsockname()[1]
        tls = _tls(settings)
        self.scheme = "https" if tls else "http"
        # a WebSocket message is a request body: the same limit (uvicorn's own is 16 MB)
        config = uvicorn.Config(app, log_level="info" if settings.debug else "warning",
                                access_log=settings.debug,
                                # uvicorn annotates an int; it waits any number of seconds
                                timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]
                                ws_max_size=int(settings.max_body_mb * 2 ** 20), **tls)
        drain = getattr(app.state, "drain", None)
        self.drain = drain if isinstance(drain, Drain) else Drain()
        self.drain.grace = settings.shutdown_grace_s
        self.server = _Server(config, self.drain)
        logging.getLogger("uvicorn.error").addFilter(DROPPED_ON_PURPOSE)   # once: filters are a set
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{self.port}/v1"

    def serve_forever(self) -> None:
        self.server.run(sockets=self.sockets)

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
        """Stops as SIGTERM does: open streams end with an error event, short requests get the
        grace period (shutdown_grace_s) to finish."""
        self.drain.start()
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=self.settings.shutdown_grace_s + 10)
        for sock in self.sockets:
            sock.close()


def _tls(settings: Settings) -> dict[str, Any]:
    if not (settings.cert_path or settings.key_path):
        return {}
    if not (settings.cert_path and settings.key_path):
        raise SettingsError("HTTPS needs both cert_path and key_path (OPENEDAI_CERT_PATH / OPENEDAI_KEY_PATH).")
    for path in (settings.cert_path, settings.key_path):
        if not os.path.isfile(path):
            raise SettingsError(f"HTTPS: no such file {path}; fix cert_path / key_path.")
    return {"ssl_certfile": settings.cert_path, "ssl_keyfile": settings.key_path}


def announce(server: ApiServer) -> None:
    print(f"OpenAI-compatible API at {server.url}  (set OPENAI_BASE_URL to this)", file=sys.stderr, flush=True)
