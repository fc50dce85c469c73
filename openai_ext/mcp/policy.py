"""Where the server may connect on a client's behalf (``mcp_allow``), and the 400 that says why not.

An MCP tool makes this server send requests to a URL a client chose: without a rule that is a way
into whatever this machine can reach (SSRF). So outbound MCP is off until ``mcp_allow`` lists
``HOST[:PORT]`` patterns (``*`` and ``?`` as in file names; no port: any port). A wildcard pattern
reaches public addresses only: a server whose name resolves to a loopback, private, link-local or
otherwise reserved address must be named by a pattern without a wildcard (``127.0.0.1:8000``,
``localhost``, ``mcp.lan``), so ``*`` alone never opens the machine's own services or the LAN.

The name is resolved when the request is checked; a name that resolves to another address by the
time the SDK connects (DNS rebinding) is not caught here, which is one more reason to list names
you trust rather than ``*``.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio

from ..core.errors import InvalidRequestError

RESOLVE_TIMEOUT = 5.0   # seconds a name lookup may take


def _host_port(pattern: str) -> tuple[str, int | None]:
    pattern = pattern.strip().lower()
    if pattern.startswith("["):                       # [::1]:8000
        host, _, rest = pattern[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    host, colon, port = pattern.rpartition(":")
    if colon and port.isdigit() and ":" not in host:
        return host, int(port)
    return pattern, None


@dataclass(frozen=True)
class Rule:
    host: str
    port: int | None

    @property
    def wildcard(self) -> bool:
        return any(c in self.host for c in "*?[")

    def matches(self, host: str, port: int) -> bool:
        return (self.port is None or self.port == port) and fnmatch.fnmatchcase(host, self.host)


def _internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global


class Policy:
    """The ``mcp_allow`` rules, checked for every server URL before any connection is made."""

    def __init__(self, allow: list[str]):
        self.rules = [Rule(*_host_port(p)) for p in allow if p.strip()]

    @property
    def enabled(self) -> bool:
        return bool(self.rules)

    async def check(self, url: str, param: str) -> None:
        """A 400 naming ``param`` unless ``url`` is an http(s) URL of a host the rules allow."""
        if not self.enabled:
            raise InvalidRequestError(
                "This server makes no outbound MCP connections until it is told where it may go: start it with "
                "--mcp-allow HOST[:PORT] (the mcp_allow setting), e.g. --mcp-allow localhost:8000.", param=param,
                code="mcp_not_allowed")
        if importlib.util.find_spec("mcp") is None:
            raise InvalidRequestError("Calling MCP servers needs the official MCP SDK, which is not installed here: "
                                      "pip install 'mcp>=2.3,<3' (in the web UI's environment, this upgrades its "
                                      "sse-starlette).", param=param, code="mcp_not_available")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidRequestError(f"{param} must be an http:// or https:// URL of an MCP server.", param=param)
        if parts.username or parts.password:
            raise InvalidRequestError(f"{param} carries a user name or password; send credentials as "
                                      "authorization (or headers) instead.", param=param)
        host = parts.hostname.lower()
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise InvalidRequestError(f"{param} has an invalid port.", param=param) from None
        rules = [r for r in self.rules if r.matches(host, port)]
        if not rules:
            raise self._refused(param, host, port, "no mcp_allow pattern matches it")
        if all(r.wildcard for r in rules) and await self._reaches_inside(host, port, param):
            raise self._refused(param, host, port, "it is a loopback, private or reserved address, which only a "
                                                   "pattern without wildcards may allow")

    @staticmethod
    def _refused(param: str, host: str, port: int, why: str) -> InvalidRequestError:
        return InvalidRequestError(f"The MCP server at {host}:{port} is not allowed here: {why}. Add it to "
                                   f"--mcp-allow (the mcp_allow setting) to allow it.", param=param,
                                   code="mcp_not_allowed")

    @staticmethod
    async def _reaches_inside(host: str, port: int, param: str) -> bool:
        try:
            return _internal(host)
        except ValueError:
            pass   # a name, not an address
        try:
            with anyio.fail_after(RESOLVE_TIMEOUT):
                found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError):
            raise InvalidRequestError(f"The MCP server's host {host!r} could not be resolved; check {param}.",
                                      param=param, code="mcp_not_allowed") from None
        return any(_internal(str(info[4][0])) for info in found)
