"""Clients of the servers the fixtures start."""

from __future__ import annotations

import socket


def openai_client(server, **kw):
    from openai import OpenAI

    return OpenAI(base_url=server.url, api_key=kw.pop("api_key", "dummy"), max_retries=0,
                  _strict_response_validation=True, timeout=kw.pop("timeout", 120), **kw)


def has_ipv6_loopback() -> bool:
    """Whether this machine can bind ::1 (some containers have no IPv6)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False
