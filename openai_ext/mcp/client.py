"""Listing and calling an MCP server's tools through the official ``mcp`` SDK, each under a deadline.

One connection per operation: a tool list is read once per chain of responses (and kept in it as
an ``mcp_list_tools`` item) and a call is a round trip, so a pool would buy little and would
have to be shared safely between clients whose credentials differ. The transport is Streamable
HTTP, or the older SSE transport for a URL whose path ends in ``/sse`` (as such servers are
published).

Every failure becomes the error object OpenAI's ``mcp_call`` items carry (``McpFailure.error``):
``http_error`` for a server that cannot be reached, answers with an HTTP error or passes the
deadline; ``mcp_protocol_error`` for a JSON-RPC error; ``mcp_tool_execution_error`` for a tool
that ran and failed (its result's ``isError``). Headers (credentials) are sent and never logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

import anyio

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Server:
    """One MCP server as a request names it."""
    label: str
    url: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)   # credentials among them: never shown


@dataclass(frozen=True)
class Limits:
    timeout: float            # seconds for one whole operation: connect, handshake, request, answer
    max_result_bytes: int     # the largest tool result taken (UTF-8 bytes of its text)

    @classmethod
    def of(cls, settings: Any) -> "Limits":
        """The limits the settings give (mcp_timeout, mcp_max_result_bytes)."""
        return cls(timeout=settings.mcp_timeout, max_result_bytes=settings.mcp_max_result_bytes)


class McpFailure(Exception):
    """An MCP operation that failed; ``error`` is its object in OpenAI's MCPToolCallError shape."""

    def __init__(self, error: dict[str, Any]):
        self.error = error
        super().__init__(self.message)

    @property
    def message(self) -> str:
        e = self.error
        if e["type"] == "mcp_tool_execution_error":
            return f"the tool failed: {text_of(e['content'])}"
        return str(e["message"])


def _http(code: int, message: str) -> McpFailure:
    return McpFailure({"type": "http_error", "code": code, "message": message})


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside task groups' exception groups (the SDK runs its transport in one)."""
    inner = getattr(exc, "exceptions", None)   # a BaseExceptionGroup (Python 3.11 and the backport)
    if isinstance(inner, (list, tuple)):
        return [leaf for e in inner for leaf in _leaves(e)]
    return [exc]


def _failure(exc: BaseException, server: Server, limits: Limits) -> McpFailure:
    import httpx2
    from mcp import MCPError

    where = f"The MCP server {server.label!r}"
    for e in _leaves(exc):
        if isinstance(e, McpFailure):
            return e
        if isinstance(e, httpx2.HTTPStatusError):
            status = e.response.status_code
            return _http(status, f"{where} answered HTTP {status} {e.response.reason_phrase}".rstrip() + ".")
        if isinstance(e, MCPError):
            return McpFailure({"type": "mcp_protocol_error", "code": int(e.error.code), "message": e.error.message})
        if isinstance(e, (TimeoutError, httpx2.TimeoutException)):   # (an OSError too: first)
            return _http(504, f"{where} did not answer within {limits.timeout:g} s (the mcp_timeout setting).")
        if isinstance(e, (httpx2.TransportError, OSError)):
            return _http(502, f"{where} could not be reached ({type(e).__name__}: {e}).")
    log.warning("MCP server %r: unexpected failure", server.label, exc_info=exc)
    return _http(502, f"{where} failed: {type(exc).__name__}: {exc}")


@contextlib.asynccontextmanager
async def connected(server: Server, limits: Limits) -> AsyncIterator[Any]:
    """An open session with the server (the SDK's Client), for as long as the ``async with``."""
    import httpx2
    from mcp import Client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    timeout = httpx2.Timeout(limits.timeout)
    # An SSE event holds one JSON-RPC message; the SDK's own bound keeps a hostile one from
    # filling memory before the result's size is checked.
    event_bound = max(limits.max_result_bytes * 4, 1 << 16)
    if urlsplit(server.url).path.rstrip("/").endswith("/sse"):
        transport: Any = sse_client(server.url, headers=server.headers, timeout=limits.timeout,
                                    sse_read_timeout=limits.timeout)
        http = None
    else:
        http = create_mcp_http_client(headers=server.headers, timeout=timeout)
        transport = streamable_http_client(server.url, http_client=http, max_sse_event_size=event_bound)
    async with contextlib.AsyncExitStack() as stack:
        if http is not None:
            await stack.enter_async_context(http)
        client = await stack.enter_async_context(Client(transport, read_timeout_seconds=limits.timeout, cache=None))
        yield client


async def _run(server: Server, limits: Limits, work: Any) -> Any:
    try:
        with anyio.fail_after(limits.timeout):
            async with connected(server, limits) as client:
                return await work(client)
    except McpFailure:
        raise
    except Exception as e:   # noqa: BLE001 - every failure of the remote side becomes its error object
        raise _failure(e, server, limits) from None


def _tool(tool: Any) -> dict[str, Any]:
    dumped = tool.model_dump(by_alias=True, exclude_none=True, mode="json")
    annotations = dumped.get("annotations")
    return {"name": dumped["name"], "description": dumped.get("description"),
            "input_schema": dumped.get("inputSchema") or {"type": "object", "properties": {}},
            "annotations": annotations or None}


async def list_tools(server: Server, limits: Limits, *, max_pages: int = 20) -> list[dict[str, Any]]:
    """The server's tools in OpenAI's MCPListToolsTool shape (every page, up to ``max_pages``)."""
    async def work(client: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        cursor = None
        for _ in range(max_pages):
            page = await client.list_tools(cursor=cursor)
            out += [_tool(t) for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        return out

    return await _run(server, limits, work)


async def list_many(servers: list[Server], limits: Limits) -> list[list[dict[str, Any]] | McpFailure]:
    """Each server's tools (``list_tools``), all listed at once; a server that cannot list gives
    its McpFailure in its place, for the caller to tell."""
    listed: list[Any] = [None] * len(servers)

    async def one(k: int, server: Server) -> None:
        try:
            listed[k] = await list_tools(server, limits)
        except McpFailure as e:
            listed[k] = e

    async with anyio.create_task_group() as tg:
        for k, server in enumerate(servers):
            tg.start_soon(one, k, server)
    return listed


def text_of(content: Any) -> str:
    """A tool result's content blocks as the text the model reads: text blocks as they are, any
    other block (an image, a resource) as its JSON."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(json.dumps(block, ensure_ascii=False))
    return "\n".join(parts)


async def call_tool(server: Server, name: str, arguments: dict[str, Any], limits: Limits) -> str:
    """The tool's result as text; a failure (the tool's own included) raises ``McpFailure``."""
    async def work(client: Any) -> str:
        result = await client.call_tool(name, arguments)
        content = [b.model_dump(by_alias=True, exclude_none=True, mode="json") for b in result.content]
        if result.is_error:
            raise McpFailure({"type": "mcp_tool_execution_error", "content": content})
        if not content and result.structured_content is not None:
            return json.dumps(result.structured_content, ensure_ascii=False)
        return text_of(content)

    out: str = await _run(server, limits, work)
    size = len(out.encode())
    if size > limits.max_result_bytes:
        raise _http(502, f"The MCP server {server.label!r} returned {size} bytes, more than this server takes "
                         f"({limits.max_result_bytes}, the mcp_max_result_bytes setting).")
    return out
