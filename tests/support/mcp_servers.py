"""Real MCP servers for the tests: the official SDK's ``MCPServer`` (FastMCP in the SDK's first
release) served by uvicorn on a thread, over Streamable HTTP (``/mcp``) and the older SSE
transport (``/sse``). Each server records what it was asked (``calls``: tool name and
arguments; ``headers``: the headers of each HTTP request), and one tool can be held to play a
server that hangs."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from support.servers import free_port


@dataclass
class McpServer:
    url: str                     # Streamable HTTP endpoint
    sse_url: str                 # SSE endpoint of the same tools
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)   # lets a held 'wait' call end
    _uvicorn: Any = None
    _thread: Any = None

    def reset(self) -> None:
        self.calls.clear()
        self.headers.clear()
        self.release.clear()

    def stop(self) -> None:
        """Stops it, and waits until its port is closed."""
        self.release.set()
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)


def _record_headers(app: Any, into: list[dict[str, str]]) -> Any:
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            into.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)
    return wrapped


def start_demo_server(port: int | None = None) -> McpServer:
    """A server with four tools: ``add`` (read-only), ``echo``, ``fail`` (always raises) and
    ``wait`` (held until ``release`` is set, as a hanging server). ``port``: to start one again
    where a stopped one was."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations
    from starlette.applications import Starlette

    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    server = McpServer(url=f"{base}/mcp", sse_url=f"{base}/sse")
    mcp = MCPServer("demo", log_level="ERROR")

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        server.calls.append(("add", {"a": a, "b": b}))
        return a + b

    @mcp.tool()
    def echo(text: str) -> str:
        """Repeat the text back."""
        server.calls.append(("echo", {"text": text}))
        return f"echo: {text}"

    @mcp.tool()
    def fail(reason: str) -> str:
        """A tool that always fails."""
        server.calls.append(("fail", {"reason": reason}))
        raise ValueError(f"failed on purpose: {reason}")

    @mcp.tool()
    async def wait(seconds: int) -> str:
        """Wait, then answer."""
        server.calls.append(("wait", {"seconds": seconds}))
        while not server.release.is_set():
            await asyncio.sleep(0.05)
        return "done waiting"

    import uvicorn

    http_app = mcp.streamable_http_app()
    sse_app = mcp.sse_app()
    # one Starlette app: /mcp (Streamable HTTP, with its session manager's lifespan) and /sse + /messages/
    app = Starlette(routes=[*http_app.routes, *sse_app.routes], lifespan=http_app.router.lifespan_context)
    config = uvicorn.Config(_record_headers(app, server.headers), host="127.0.0.1", port=port, log_level="warning",
                            lifespan="on")
    runner = uvicorn.Server(config)
    server._uvicorn = runner
    server._thread = threading.Thread(target=runner.run, daemon=True, name="mcp-demo-server")
    server._thread.start()
    deadline = time.monotonic() + 30
    while not runner.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the MCP test server did not start")
        time.sleep(0.02)
    return server


def mcp_tool(server: McpServer, **extra: Any) -> dict[str, Any]:
    """Responses' mcp tool for the demo server, approvals off unless ``extra`` says otherwise."""
    return {"type": "mcp", "server_label": "demo", "server_url": server.url, "require_approval": "never", **extra}


class FrozenServer:
    """A server that accepts connections and never answers (a process stopped with SIGSTOP looks
    so from outside: its port still takes connections)."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"

    def close(self) -> None:
        self.sock.close()
