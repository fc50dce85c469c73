"""Anthropic's MCP connector: ``mcp_servers`` on POST /v1/messages, served on the local model.

A request names remote MCP servers (``{"type": "url", "url", "name", "authorization_token"}``)
and, behind the ``anthropic-beta`` header, says which of their tools the model may call:
``mcp-client-2025-04-04`` with each server's ``tool_configuration`` (``enabled``,
``allowed_tools``), ``mcp-client-2025-11-20`` with one ``mcp_toolset`` entry in ``tools`` per
server (``default_config`` and per-tool ``configs``, ``enabled`` each). Without the header,
``mcp_servers`` is a 400 that says to send it.

``read`` checks all of that before anything runs; ``Connector.open`` then checks every URL
against ``mcp_allow`` (mcp/policy.py), before any connection, and lists each server's tools
once, all servers at once. The tools are offered to the model beside the request's own
(offered.py); ``Connector.call`` runs a call the model made (endpoint.py), each under
``mcp_timeout``, at most ``mcp_max_calls`` a response. A call that fails is a result with
``is_error``: the model reads what went wrong and goes on. A server whose tools cannot be listed
fails the request, naming the server: 400 where the server refused what the request sent (its
URL or token), else 502 (504 past ``mcp_timeout``).

The token goes out as ``Authorization: Bearer <token>`` and nowhere else: it is not logged, not
kept with a thread, not part of any error message or response.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..core.config import Settings
from ..core.errors import InvalidRequestError, OpenAIError, UpstreamError
from ..mcp.client import Limits, McpFailure, Server, call_tool, list_many
from ..mcp.policy import Policy
from .protocol import McpServerDefinition, McpToolset, MessagesRequest, parse

log = logging.getLogger(__name__)

OLD_BETA = "mcp-client-2025-04-04"
NEW_BETA = "mcp-client-2025-11-20"
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")    # a tool name the model can be offered (as chat's)


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def betas(headers: Any) -> set[str]:
    """The beta names of a request's ``anthropic-beta`` headers (comma-separated, one or many)."""
    values = headers.getlist("anthropic-beta") if hasattr(headers, "getlist") else [headers.get("anthropic-beta", "")]
    return {b.strip() for v in values for b in str(v).split(",") if b.strip()}


@dataclass(frozen=True)
class Chooser:
    """Which of a server's tools are offered: ``default``, unless ``only`` (allowed_tools) or a
    per-tool setting (``tools``: name -> enabled) says otherwise."""
    default: bool = True
    only: frozenset[str] | None = None
    tools: Mapping[str, bool] = field(default_factory=dict)

    def __call__(self, name: str) -> bool:
        if name in self.tools:
            return self.tools[name]
        return name in self.only if self.only is not None else self.default


@dataclass(frozen=True)
class Source:
    """One entry of mcp_servers: where it is, and which of its tools are offered."""
    index: int
    server: Server            # its headers hold the token: never shown
    chooser: Chooser

    @property
    def name(self) -> str:
        return self.server.label

    @property
    def where(self) -> str:
        return f"mcp_servers[{self.index}]"


@dataclass(frozen=True)
class McpTool:
    """A tool of an MCP server, as the model is offered it."""
    source: Source
    name: str
    description: str
    schema: dict[str, Any]

    def function(self) -> dict[str, Any]:
        """The tool as a chat function tool."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.schema, "strict": False}}


def read(req: MessagesRequest, headers: Any, settings: Settings) -> "Connector | None":
    """The request's MCP servers, checked (every 400 of the connector but the policy's); None
    when it names none."""
    toolsets = [(j, t) for j, t in enumerate(req.tools or [])
                if isinstance(t, dict) and t.get("type") == "mcp_toolset"]
    if req.mcp_servers is None:
        if toolsets:
            j = toolsets[0][0]
            raise _bad(f"tools[{j}] is an mcp_toolset, whose mcp_server_name names a server of mcp_servers; send "
                       f"mcp_servers too (with the header 'anthropic-beta: {NEW_BETA}').", f"tools[{j}].type")
        return None
    sent = betas(headers)
    if OLD_BETA not in sent and NEW_BETA not in sent:
        raise _bad(f"mcp_servers is Anthropic's MCP connector, a beta feature: send the header 'anthropic-beta: "
                   f"{NEW_BETA}' (or the older {OLD_BETA}) with it (the anthropic SDK: "
                   f"client.beta.messages.create(..., betas=['{NEW_BETA}'])).", "mcp_servers")
    servers: list[McpServerDefinition] = parse(list[McpServerDefinition], req.mcp_servers, "mcp_servers")
    seen: dict[str, int] = {}
    for i, s in enumerate(servers):
        if s.name in seen:
            raise _bad(f"mcp_servers[{i}].name '{s.name}' is the name of mcp_servers[{seen[s.name]}] too; give each "
                       "server its own name.", f"mcp_servers[{i}].name")
        seen[s.name] = i
    # with both betas sent, the request's shape says which one it follows
    if NEW_BETA in sent and (toolsets or OLD_BETA not in sent):
        choosers = _from_toolsets(servers, toolsets, seen)
    else:
        if toolsets:
            j = toolsets[0][0]
            raise _bad(f"tools[{j}] is an mcp_toolset, which needs the header 'anthropic-beta: {NEW_BETA}' (with "
                       f"{OLD_BETA}, configure each server's tools in its tool_configuration).", f"tools[{j}].type")
        choosers = [_from_configuration(s) for s in servers]
    sources = [Source(i, Server(s.name, s.url, _auth(s.authorization_token)), c)
               for i, (s, c) in enumerate(zip(servers, choosers, strict=True))]
    return Connector(sources, settings)


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _from_configuration(s: McpServerDefinition) -> Chooser:
    """mcp-client-2025-04-04: tool_configuration's enabled (all or none) and allowed_tools."""
    config = s.tool_configuration
    if config is None:
        return Chooser()
    if config.enabled is False:
        return Chooser(default=False)
    return Chooser(only=frozenset(config.allowed_tools) if config.allowed_tools is not None else None)


def _from_toolsets(servers: list[McpServerDefinition], toolsets: list[tuple[int, Any]],
                   names: dict[str, int]) -> list[Chooser]:
    """mcp-client-2025-11-20: each server configured by the one mcp_toolset that names it."""
    for i, s in enumerate(servers):
        if s.tool_configuration is not None:
            raise _bad(f"mcp_servers[{i}].tool_configuration belongs to {OLD_BETA}; with {NEW_BETA}, say which tools "
                       "are enabled in the server's mcp_toolset entry in tools (default_config, configs).",
                       f"mcp_servers[{i}].tool_configuration")
    choosers: dict[int, Chooser] = {}
    for j, raw in toolsets:
        t: McpToolset = parse(McpToolset, raw, f"tools[{j}]")
        if t.mcp_server_name not in names:
            raise _bad(f"tools[{j}].mcp_server_name '{t.mcp_server_name}' names no server of mcp_servers "
                       f"({', '.join(repr(n) for n in names)}).", f"tools[{j}].mcp_server_name")
        i = names[t.mcp_server_name]
        if i in choosers:
            raise _bad(f"tools[{j}] is a second mcp_toolset for the server '{t.mcp_server_name}'; configure each "
                       "server in one mcp_toolset.", f"tools[{j}].mcp_server_name")
        if t.tools is not None:
            raise _bad(f"tools[{j}].tools (a pinned tool listing) is not served here: leave it out, and the server's "
                       "tools are listed for each request.", f"tools[{j}].tools")
        default = t.default_config.enabled if t.default_config and t.default_config.enabled is not None else True
        per_tool = {name: c.enabled for name, c in (t.configs or {}).items() if c.enabled is not None}
        choosers[i] = Chooser(default=default, tools=per_tool)
    for i, s in enumerate(servers):
        if i not in choosers:
            raise _bad(f"mcp_servers[{i}] ('{s.name}') is named by no mcp_toolset: with {NEW_BETA}, add "
                       f"{{\"type\": \"mcp_toolset\", \"mcp_server_name\": \"{s.name}\"}} to tools.",
                       f"mcp_servers[{i}]")
    return [choosers[i] for i in range(len(servers))]


class Connector:
    """One request's MCP servers: their tools, listed once (``open``), and the calls run so far."""

    def __init__(self, sources: list[Source], settings: Settings):
        self.sources = sources
        self.settings = settings
        self.tools: list[McpTool] = []
        self.calls = 0

    @property
    def limits(self) -> Limits:
        return Limits.of(self.settings)

    @property
    def exhausted(self) -> bool:
        """The response has made all the MCP calls it may: no more are offered."""
        return self.calls >= self.settings.mcp_max_calls

    def offered(self) -> list[McpTool]:
        """The tools the model may call in the next pass."""
        return [] if self.exhausted else self.tools

    def servers(self) -> dict[str, str]:
        """Each tool's name -> the name of its server."""
        return {t.name: t.source.name for t in self.tools}

    async def open(self) -> None:
        """Every URL checked against mcp_allow (a 400 before any connection), then every server's
        tools listed, all at once."""
        policy = Policy(self.settings.mcp_allow)
        for s in self.sources:
            await policy.check(s.server.url, f"{s.where}.url")
        listed = await list_many([s.server for s in self.sources], self.limits)
        owners: dict[str, McpTool] = {}
        for s, got in zip(self.sources, listed, strict=True):
            if isinstance(got, McpFailure):
                raise _unlisted(s, got)
            for t in got:
                if not s.chooser(t["name"]):
                    continue
                if not _NAME.match(t["name"]):
                    log.warning("MCP server %r: its tool %r is not offered (a tool name is 1-64 letters, digits, "
                                "underscores or dashes)", s.name, t["name"][:80])
                    continue
                if t["name"] in owners:
                    other = owners[t["name"]].source
                    raise _bad(f"The MCP servers '{other.name}' ({other.where}) and '{s.name}' ({s.where}) both offer "
                               f"a tool named '{t['name']}'; the model calls tools by name, so leave it out of one "
                               "of them (its tool configuration).", s.where)
                owners[t["name"]] = McpTool(s, t["name"], t.get("description") or "", t["input_schema"])
        self.tools = list(owners.values())

    async def call(self, name: str, arguments: Any) -> tuple[str, bool]:
        """(the result's text, whether it is an error) of the model's call of the tool ``name``."""
        tool = next((t for t in self.tools if t.name == name), None)
        if tool is None:    # the parser passes only the tools offered: never seen
            return f"There is no MCP tool named '{name}'.", True
        if self.exhausted:
            return (f"Not run: this response has made the {self.settings.mcp_max_calls} MCP tool calls it may make "
                    "(the mcp_max_calls setting). Answer with what you have.", True)
        self.calls += 1
        if not isinstance(arguments, dict):
            return "The arguments must be a JSON object.", True
        try:
            return await call_tool(tool.source.server, name, arguments, self.limits), False
        except McpFailure as e:
            return e.message, True


def _unlisted(s: Source, failure: McpFailure) -> OpenAIError:
    """The error of a request whose server's tools could not be listed: a 400 where the server
    refused what the request sent (an HTTP 4xx, or a JSON-RPC error but an internal one: the MCP
    SDK reads a 404 as "method not found"), else 502, or 504 past mcp_timeout."""
    e = failure.error
    message = f"The tools of the MCP server '{s.name}' ({s.where}) could not be listed: {failure.message}"
    code = int(e.get("code") or 0)
    if (e["type"] == "http_error" and 400 <= code < 500) or (e["type"] == "mcp_protocol_error" and code != -32603):
        return _bad(message.rstrip(".") + ". Check its url and authorization_token.", s.where)
    return UpstreamError(message, param=s.where, code="mcp_server_error", status=504 if code == 504 else 502,
                         retry=e["type"] == "http_error")
