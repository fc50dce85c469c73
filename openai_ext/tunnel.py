"""The public tunnel: a TryCloudflare (or named Cloudflare) tunnel to the API, through
flask-cloudflared, started in the background so the local server never waits on it."""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time

from .config import Settings

log = logging.getLogger(__name__)
ATTEMPTS = 3


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


def _open(settings: Settings, port: int) -> None:
    try:
        from flask_cloudflared import _run_cloudflared
    except ImportError:
        log.error("The public tunnel needs flask-cloudflared: pip install flask-cloudflared")
        return
    error: Exception | None = None
    for attempt in range(ATTEMPTS):
        try:
            url = _run_cloudflared(port, _free_port(), tunnel_id=settings.public_api_id or None)
            where = f"{url}/v1" if str(url).startswith("http") else f"the hostname of tunnel {settings.public_api_id}"
            print(f"Public API at {where}  (OPENAI_BASE_URL for remote apps; the api_key is required)",
                  file=sys.stderr, flush=True)
            return
        except Exception as e:  # noqa: BLE001 - any failure is reported once, below
            error = e
            if attempt + 1 < ATTEMPTS:
                time.sleep(2 * (attempt + 1))
    log.error("The public tunnel could not start (%s: %s); the API keeps serving locally.",
              type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "")
