"""The public tunnel: a TryCloudflare (or named Cloudflare) tunnel to the API, through
flask-cloudflared, started in the background so the local server never waits on it."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from typing import Any, Iterator

from .config import Settings

log = logging.getLogger(__name__)
ATTEMPTS = 3
TRYCLOUDFLARE = ".trycloudflare.com"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refusal(settings: Settings, scheme: str) -> str | None:
    """Why the tunnel must not open, if it must not."""
    if not settings.api_key and not settings.allow_open_tunnel:
        return ("Not opening the public tunnel without an api_key: anyone could use the API. Set api_key "
                "(or allow_open_tunnel to do it anyway).")
    if scheme == "https":
        return "The public tunnel forwards to plain HTTP; turn HTTPS (cert_path/key_path) off to use it."
    return None


def opens(settings: Settings) -> bool:
    """Whether the settings open the public tunnel (it may still fail to start)."""
    return settings.public_api and refusal(settings, scheme_of(settings)) is None


def host_suffixes(settings: Settings) -> tuple[str, ...]:
    """Host names the Host check lets in for the tunnel: a TryCloudflare tunnel's requests carry
    its random *.trycloudflare.com name. A named tunnel's own hostname goes in allowed_hosts."""
    if opens(settings) and not settings.public_api_id:
        return (TRYCLOUDFLARE,)
    return ()


def scheme_of(settings: Settings) -> str:
    return "https" if settings.cert_path and settings.key_path else "http"


def start(settings: Settings, port: int, scheme: str = "http") -> threading.Thread | None:
    if not settings.public_api:
        return None
    reason = refusal(settings, scheme)
    if reason:
        log.error("%s", reason)
        return None
    thread = threading.Thread(target=_open, args=(settings, port), name="public-tunnel", daemon=True)
    thread.start()
    return thread


class NoAddress(RuntimeError):
    pass


def stop() -> None:
    """Ends the cloudflared process, if one runs. flask-cloudflared ends it at exit, but uvicorn
    ends the process by raising its stop signal again, so that exit handler never runs."""
    module = sys.modules.get("flask_cloudflared")
    if module is not None:
        with contextlib.suppress(Exception):
            module._cleanup_existing_cloudflared()


def _open(settings: Settings, port: int) -> None:
    try:
        import flask_cloudflared
    except ImportError:
        log.error("The public tunnel needs flask-cloudflared: pip install flask-cloudflared")
        return
    error: Exception | None = None
    for attempt in range(ATTEMPTS):
        try:
            # each attempt first ends the cloudflared process a failed attempt left running
            with _prints_to_debug_log():
                url = flask_cloudflared._run_cloudflared(port, _free_port(), tunnel_id=settings.public_api_id or None)
            where = _where(settings, url)
            print(f"Public API at {where}  (OPENAI_BASE_URL for remote apps; the api_key is required)",
                  file=sys.stderr, flush=True)
            return
        except Exception as e:  # noqa: BLE001 - any failure is reported once, below
            error = e
            if attempt + 1 < ATTEMPTS:
                time.sleep(2 * (attempt + 1))
    stop()   # no tunnel left half open
    reason = str(error).splitlines()[0] if str(error) else ""
    log.error("The public tunnel could not start (%s: %s); the API keeps serving locally.",
              type(error).__name__, reason if len(reason) <= 300 else reason[:300] + "...")


def _where(settings: Settings, url: Any) -> str:
    """Where the tunnel answers, from what flask-cloudflared returned."""
    if settings.public_api_id:
        return (f"the hostname of tunnel {settings.public_api_id} (add that name to the allowed_hosts "
                "setting, or the Host check refuses its requests)")
    if not str(url).startswith("http"):
        # flask-cloudflared gives None when cloudflared's metrics name no trycloudflare.com
        # address, as when its request for a quick tunnel failed: nothing would be reachable.
        raise NoAddress("cloudflared reported no trycloudflare.com address")
    return f"{url}/v1"


class _ThreadFilter:
    """sys.stdout, minus what one thread writes (that goes to the debug log)."""

    def __init__(self, real: Any, thread: int):
        self.real = real
        self.thread = thread

    def write(self, text: str) -> int:
        if threading.get_ident() != self.thread:
            return self.real.write(text)
        if text.strip():
            log.debug("cloudflared: %s", text.strip())
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@contextlib.contextmanager
def _prints_to_debug_log() -> Iterator[None]:
    """flask-cloudflared prints its progress (" * Downloading cloudflared ...") on every attempt;
    the tunnel's outcome is told in one line instead. Other threads keep printing as before."""
    real = sys.stdout
    sys.stdout = _ThreadFilter(real, threading.get_ident())
    try:
        yield
    finally:
        if isinstance(sys.stdout, _ThreadFilter):
            sys.stdout = real
