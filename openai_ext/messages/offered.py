"""The tools a Messages request offers the model, in chat's terms.

``tools`` holds custom tools (name, description, input_schema), which become chat function tools;
Anthropic's server tools are refused by name. System messages in ``messages`` may change the set
mid-conversation with tool_addition and tool_removal blocks (a tool_reference to a tool of
``tools`` or of an earlier addition, or an inline tool_definition). Chat templates show the tools
once, before the conversation, so the model is shown the set as the conversation leaves it: the
tools it may call in the answer it is about to write. The ``mcp_toolset`` entries of ``tools``
are read by connector.py, whose MCP servers' tools are offered after the request's own (a name
offered by both is a 400).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..core.errors import InvalidRequestError
from .protocol import CountTokensRequest

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)

TOOL_CHANGES = ("tool_addition", "tool_removal")


def _function(t: Any, where: str) -> dict[str, Any]:
    """A custom tool's definition as a chat function tool."""
    if not isinstance(t, dict):
        raise _bad(f"{where} must be a tool definition object.", where)
    kind = t.get("type")
    if kind not in (None, "custom"):
        raise _bad(f"{where} is Anthropic's server tool '{kind}', which this server does not run. Only "
                   "custom tools (name, description, input_schema) can be used.", f"{where}.type")
    name = t.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(f"{where}.name must be 1-64 letters, digits, underscores or dashes.", f"{where}.name")
    schema = t.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise _bad(f"{where}.input_schema must be a JSON Schema with type 'object'.",
                   f"{where}.input_schema")
    return {"type": "function", "function": {"name": name, "description": t.get("description") or "",
                                             "parameters": schema, "strict": t.get("strict") is True}}


# A chat function tool, and the path of the definition it came from (tools[j], or a tool change's).
Offered = tuple[str, dict[str, Any]]


def _offered(req: CountTokensRequest, mcp: bool) -> list[Offered] | None:
    """``tools`` as the system messages' tool changes leave them, as chat function tools.
    ``mcp``: the request's MCP toolsets are served (connector.py reads them)."""
    known = {f["function"]["name"]: (f"tools[{j}]", f) for j, t in enumerate(req.tools or [])
             if not (mcp and isinstance(t, dict) and t.get("type") == "mcp_toolset")
             for f in [_function(t, f"tools[{j}]")]}
    offered = dict(known)
    for i, m in enumerate(req.messages):
        if m.role != "system" or not isinstance(m.content, list):
            continue
        for j, b in enumerate(m.content):
            if b.type not in TOOL_CHANGES:
                continue
            where = f"messages[{i}].content[{j}].tool"
            tool = (b.model_extra or {}).get("tool")
            if not isinstance(tool, dict):
                tool = {}     # no object: no kind, refused below
            kind = tool.get("type")
            if kind == "tool_reference" and isinstance(tool.get("name"), str):
                name = tool["name"]
                if name not in known:
                    raise _bad(f"{where} names '{name}', which is neither in tools nor defined by an earlier "
                               "tool_addition.", f"{where}.name")
                if b.type == "tool_addition":
                    offered[name] = known[name]
                else:
                    offered.pop(name, None)
            elif kind == "tool_definition" and b.type == "tool_addition":
                f = _function(tool.get("definition"), f"{where}.definition")
                known[f["function"]["name"]] = offered[f["function"]["name"]] = (f"{where}.definition", f)
            elif kind in ("mcp_tool_reference", "mcp_toolset_reference"):
                raise _bad(f"{where} refers to MCP tools, which a tool change cannot add or remove here: the tools "
                           "of mcp_servers are offered for the whole conversation (their tool configuration "
                           "chooses which).", f"{where}.type")
            else:
                shapes = "a tool_reference or a tool_definition" if b.type == "tool_addition" else "a tool_reference"
                raise _bad(f"{where} must be {shapes}.", where)
    return list(offered.values()) if req.tools is not None or offered else None


@dataclass
class ChatTools:
    """Chat's tools, tool_choice and parallel_tool_calls for a Messages request (None: not sent)."""
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


def chat_tools(req: CountTokensRequest, mcp: list[Any] | None = None, *,
               later: bool = False) -> tuple[ChatTools, list[str]]:
    """tools and tool_choice, in chat's terms, and the path each chat tool was sent under; chat's
    tools.parse checks the schemas and names. ``mcp``: the MCP servers' tools offered now
    (connector.McpTool); ``later``: a pass after MCP calls, where a forced choice (any, or a named
    tool) is auto: it was the first pass's."""
    out = ChatTools()
    own = _offered(req, mcp is not None) or []
    taken = {f["function"]["name"]: path for path, f in own}
    for t in mcp or ():
        if t.name in taken:
            raise _bad(f"{taken[t.name]} is named '{t.name}', as a tool of the MCP server '{t.source.name}' "
                       f"({t.source.where}) is; rename it, or leave the MCP server's tool out (its tool "
                       "configuration).", f"{taken[t.name]}.name")
    offered = own + [(f"{t.source.where}.tools.{t.name}", t.function()) for t in mcp or ()]
    if offered:
        out.tools = [f for _, f in offered]
    paths = [path for path, _ in offered]
    choice = req.tool_choice
    if choice is None or (later and not offered):
        return out, paths
    if later and choice.type in ("any", "tool"):
        choice = choice.model_copy(update={"type": "auto", "name": None})
    if choice.type == "tool":
        if not choice.name:
            raise _bad("tool_choice of type 'tool' needs the name of the tool.", "tool_choice.name")
        out.tool_choice = {"type": "function", "function": {"name": choice.name}}
    else:
        out.tool_choice = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use and out.tools:
        out.parallel_tool_calls = False
    return out, paths
