"""Responses' ``mcp`` tool: remote MCP servers whose tools the model calls and this server runs.

What happens to a request with ``{"type": "mcp", "server_label", "server_url", ...}`` tools:

1. Before the response begins (``list_servers``): each server URL is checked against
   ``mcp_allow`` (policy.py), and its tools are listed, unless the context already holds an
   ``mcp_list_tools`` item for its label (a previous response's, or sent back statelessly), which
   is reused as OpenAI does, so a follow-up does not list again. New lists become the response's
   first output items. A server that cannot list is a 424 naming it, as at OpenAI.
2. The listed tools (``allowed_tools`` applied) are offered to the model as function tools,
   under their own names (``<label>__<name>`` only where two servers share a name), with their
   input schemas, so their arguments are grammar-enforced like any function's (tools.py).
3. A call the model makes to one of them becomes an ``mcp_call`` item and is run here
   (``run_call``), its output or error kept on the item; then the model goes on from the result
   (stream.py), until it answers, calls a client's function, or ``mcp_max_calls`` is reached. A
   tool whose ``require_approval`` applies becomes an ``mcp_approval_request`` instead, and the
   response ends there; an ``mcp_approval_response`` in a later request (after
   ``previous_response_id``, or with the request item sent back) runs it (approved) or tells the
   model it was declined.

``headers`` and ``authorization`` go to the MCP server only: the Response repeats the tool without
them, nothing stores them, and the debug log hides them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ..core.admission import Place
from ..core.config import Settings
from ..core.errors import InvalidRequestError, OpenAIError
from ..mcp import client
from ..mcp.policy import Policy
from .item_types import Item, Items, McpApprovalRequestItem, McpCallItem, McpError, McpListToolsItem, McpTool
from .items import new_id

_LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
DECLINED = "The user declined to run this tool call."


class McpListFailed(OpenAIError):
    """A server whose tools could not be listed: OpenAI answers 424 (Failed Dependency)."""
    status = 424
    type = "external_connector_error"


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _names_filter(value: Any, where: str) -> tuple[set[str] | None, bool | None]:
    """An MCPToolFilter (or a list of names): the names it lets through (None: any), and read_only."""
    if value is None:
        return None, None
    if isinstance(value, list):
        if not all(isinstance(n, str) for n in value):
            raise _bad(where, f"{where} must be a list of tool names, or {{tool_names, read_only}}.")
        return set(value), None
    if isinstance(value, dict) and set(value) <= {"tool_names", "read_only"}:
        names = value.get("tool_names")
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise _bad(f"{where}.tool_names", f"{where}.tool_names must be a list of tool names.")
        read_only = value.get("read_only")
        if read_only is not None and not isinstance(read_only, bool):
            raise _bad(f"{where}.read_only", f"{where}.read_only must be true or false.")
        return (set(names) if names is not None else None), read_only
    raise _bad(where, f"{where} must be a list of tool names, or an object with tool_names and read_only.")


def _matches(tool: McpTool, names: set[str] | None, read_only: bool | None) -> bool:
    if names is not None and tool["name"] not in names:
        return False
    if read_only is not None:
        hint = bool((tool.get("annotations") or {}).get("readOnlyHint"))
        return hint == read_only
    return True


@dataclass
class Declared:
    """One ``mcp`` entry of a request's tools, checked."""
    index: int
    label: str
    url: str
    headers: dict[str, str] = field(repr=False)
    allowed: tuple[set[str] | None, bool | None]
    approval: Any                     # "always", "never", or {always, never} filters
    description: str | None = None

    @property
    def where(self) -> str:
        return f"tools[{self.index}]"

    @property
    def server(self) -> client.Server:
        return client.Server(self.label, self.url, self.headers)

    def offers(self, tool: McpTool) -> bool:
        return _matches(tool, *self.allowed)

    def needs_approval(self, name: str, tools: list[McpTool]) -> bool:
        """OpenAI's rule: approval is required unless ``never`` (or the never filter) says not;
        an ``always`` filter asks for it for the tools it matches, and not for the others."""
        if self.approval == "never":
            return False
        if self.approval == "always" or self.approval is None:
            return True
        # (a tool not listed is matched by its name alone)
        tool = next((t for t in tools if t["name"] == name), McpTool(name=name, input_schema={}))
        never = self.approval.get("never")
        if never is not None and _matches(tool, *_names_filter(never, "")):
            return False
        always = self.approval.get("always")
        if always is not None:
            return _matches(tool, *_names_filter(always, ""))
        return True


def declared(tools: list[Any] | None) -> list[Declared]:
    """The request's mcp tools, each checked (a 400 naming the field otherwise)."""
    out: list[Declared] = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type") != "mcp":
            continue
        where = f"tools[{i}]"
        label = tool.get("server_label")
        if not isinstance(label, str) or not label or not set(label) <= _LABEL_CHARS or len(label) > 64:
            raise _bad(f"{where}.server_label", f"{where} needs a server_label of 1-64 letters, digits, underscores "
                                                "or dashes.")
        if any(d.label == label for d in out):
            raise _bad(f"{where}.server_label", f"{where}.server_label {label!r} is used by another mcp tool; give "
                                                "each server its own label.")
        if tool.get("connector_id") is not None or tool.get("tunnel_id") is not None:
            raise _bad(f"{where}.server_url", f"{where} names one of OpenAI's connectors (or tunnels), which run on "
                                              "OpenAI's servers; give the server_url of an MCP server instead.")
        url = tool.get("server_url")
        if not isinstance(url, str) or not url:
            raise _bad(f"{where}.server_url", f"{where} needs a server_url: the URL of an MCP server.")
        headers = tool.get("headers") or {}
        if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in headers.items()):
            raise _bad(f"{where}.headers", f"{where}.headers must be an object of header names to string values.")
        token = tool.get("authorization")
        if token is not None:
            if not isinstance(token, str):
                raise _bad(f"{where}.authorization", f"{where}.authorization must be a string (an access token).")
            headers = {**headers, "Authorization": f"Bearer {token}"}
        approval = tool.get("require_approval")
        if isinstance(approval, dict):
            if not set(approval) <= {"always", "never"}:
                raise _bad(f"{where}.require_approval", f"{where}.require_approval takes always and never filters.")
            for key, value in approval.items():
                _names_filter(value, f"{where}.require_approval.{key}")
        elif approval not in (None, "always", "never"):
            raise _bad(f"{where}.require_approval", f"{where}.require_approval must be always, never, or "
                                                    "{always: filter, never: filter}.")
        allowed = _names_filter(tool.get("allowed_tools"), f"{where}.allowed_tools")
        about = tool.get("server_description")
        out.append(Declared(i, label, url, headers, allowed, approval, about if isinstance(about, str) else None))
    return out


def echo(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool as a Response repeats it: without its credentials."""
    out = {k: v for k, v in tool.items() if k not in ("authorization", "headers")}
    out.update(headers=None, require_approval=tool.get("require_approval") or "always",
               allowed_tools=tool.get("allowed_tools"))
    return out


def _listed_in(context: list[Any], label: str) -> dict[str, Any] | None:
    """The latest mcp_list_tools item of ``label`` the context holds (raw items included)."""
    for item in reversed(context):
        if isinstance(item, dict) and item.get("type") == "mcp_list_tools" and item.get("server_label") == label \
                and isinstance(item.get("tools"), list) and not item.get("error"):
            return item
    return None


@dataclass
class Listing:
    """The tools of each server of a request, and the mcp_list_tools items made for it."""
    servers: dict[str, Declared] = field(default_factory=dict)
    tools: dict[str, list[McpTool]] = field(default_factory=dict)   # label -> all its listed tools
    new: list[McpListToolsItem] = field(default_factory=list)             # items to put first in the output

    def offered(self, label: str) -> list[McpTool]:
        server = self.servers[label]
        return [t for t in self.tools.get(label, []) if server.offers(t)]


async def list_servers(settings: Settings, tools: list[Any] | None, context: list[Any]) -> Listing | None:
    """Each mcp tool's server checked against the policy, and its tools: reused from the context's
    mcp_list_tools item for its label, or listed now (a 424 naming the server when it cannot).
    None: the request has no mcp tool."""
    out = Listing()
    found = declared(tools)
    if not found:
        return None
    policy = Policy(settings.mcp_allow)
    for d in found:
        await policy.check(d.url, f"{d.where}.server_url")
    unknown = []
    for d in found:
        out.servers[d.label] = d
        known = _listed_in(context, d.label)
        if known is not None:
            # (a client's, sent back: only their names are checked)
            out.tools[d.label] = cast("list[McpTool]", [t for t in known["tools"]
                                                         if isinstance(t, dict) and isinstance(t.get("name"), str)])
        else:
            unknown.append(d)
    for d, listed in zip(unknown, await client.list_many([d.server for d in unknown], client.Limits.of(settings)),
                         strict=True):
        if isinstance(listed, client.McpFailure):
            raise McpListFailed(f"Error retrieving tool list from MCP server: {d.label!r}. {listed.message}",
                                param=f"{d.where}.server_url", code="mcp_list_tools_failed")
        out.tools[d.label] = cast("list[McpTool]", listed)   # (client.py lists them in this shape)
        # The item lists what the model may use; a tool outside allowed_tools is not shown.
        out.new.append({"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": d.label,
                        "tools": [t for t in out.tools[d.label] if d.offers(t)], "error": None})
    return out


# --- running calls ------------------------------------------------------------------------------

async def run_call(settings: Settings, server: Declared, item: McpCallItem) -> None:
    """Runs an mcp_call item's call, and records its output, or its error (a failed call is the
    item's, not the response's: the model is told, and goes on)."""
    try:
        arguments = json.loads(item["arguments"] or "{}")
        if not isinstance(arguments, dict):
            raise ValueError("not an object")
    except ValueError:
        item["status"], item["error"] = "failed", {"type": "mcp_protocol_error", "code": -32602,
                                                   "message": "The arguments are not a JSON object."}
        return
    try:
        item["output"] = await client.call_tool(server.server, item["name"], arguments, client.Limits.of(settings))
        item["status"] = "completed"
    except client.McpFailure as e:
        item["status"], item["error"] = "failed", cast(McpError, e.error)   # (client.py's, in this shape)


def call_item(label: str, name: str, arguments: str, approval_request_id: str | None = None) -> McpCallItem:
    return McpCallItem(id=new_id("mcp"), type="mcp_call", server_label=label, name=name, arguments=arguments,
                       output=None, error=None, status="in_progress", approval_request_id=approval_request_id)


def approval_request(label: str, name: str, arguments: str) -> McpApprovalRequestItem:
    return McpApprovalRequestItem(id=new_id("mcpr"), type="mcp_approval_request", server_label=label, name=name,
                                  arguments=arguments)


def refused_call(item: McpCallItem, limit: int) -> None:
    item["status"], item["error"] = "failed", {"type": "http_error", "code": 429, "message": (
        f"Not run: this server runs at most {limit} MCP calls per response (mcp_max_calls, max_tool_calls).")}


def error_text(error: McpError | str) -> str:
    """An mcp_call's error as the model reads it (a client may send it back as a plain string)."""
    if isinstance(error, str):
        return f"Error: {error}"
    if error.get("type") == "mcp_tool_execution_error":
        return f"Error: {client.text_of(error.get('content'))}"
    return f"Error: {error.get('message', 'the call failed')}"


# --- approvals ----------------------------------------------------------------------------------

def approved(context: Sequence[Item]) -> list[McpApprovalRequestItem]:
    """The approval requests approved in ``context`` whose call has not run yet, oldest first."""
    ran = {it.get("approval_request_id") for it in context if it["type"] == "mcp_call"}
    yes = {it["approval_request_id"] for it in context if it["type"] == "mcp_approval_response" and it["approve"]}
    return [it for it in context if it["type"] == "mcp_approval_request" and it["id"] in yes and it["id"] not in ran]


def declined(context: Sequence[Item]) -> dict[str, str | None]:
    """Approval request id -> the reason given, for the requests declined in ``context``."""
    return {it["approval_request_id"]: it.get("reason") for it in context
            if it["type"] == "mcp_approval_response" and not it["approve"]}


# --- a response's MCP work, as stream events ----------------------------------------------------

@dataclass
class Servers:
    """What a response needs to run MCP calls: the settings, its servers and their tools, the
    context it began with (for approvals), and the calls run so far."""
    settings: Settings
    listing: Listing
    context: Items
    limit: int                    # calls this response may run: mcp_max_calls, or max_tool_calls if lower
    ran: int = 0

    def needs_approval(self, label: str, name: str) -> bool:
        return self.listing.servers[label].needs_approval(name, self.listing.tools.get(label, []))


def opening(turn: Any) -> list[dict[str, Any]]:
    """The events of the tool lists made for this response (its first output items)."""
    state, out = turn.state, []
    for item in turn.servers.listing.new:
        index = len(state.output)
        state.output.append(item)
        where = {"item_id": item["id"], "output_index": index}
        out += [turn.event("response.output_item.added", output_index=index, item=dict(item, tools=[])),
                turn.event("response.mcp_list_tools.in_progress", **where),
                turn.event("response.mcp_list_tools.completed", **where),
                turn.event("response.output_item.done", output_index=index, item=dict(item))]
    return out


def approved_calls(turn: Any) -> list[tuple[int, McpCallItem]]:
    """The calls approved since the response that asked (each an mcp_call item, opened)."""
    out = []
    for request in approved(turn.servers.context):
        item = call_item(request["server_label"], request["name"], request["arguments"], request["id"])
        out.append((len(turn.state.output), item))
        turn.state.output.append(item)
    return out


async def run_calls(turn: Any, calls: list[tuple[int, McpCallItem]], place: Place, *,
                    opened: bool = True) -> AsyncGenerator[dict[str, Any], None]:
    """Runs the calls (in the order made), each item's end as events. ``opened``: whether its
    output_item.added was sent (a call the model made streamed it; an approved call did not).
    While a call runs, the response's generation slot serves others (``place.aside``)."""
    servers: Servers = turn.servers
    for index, item in calls:
        where = {"item_id": item["id"], "output_index": index}
        if not opened:
            yield turn.event("response.output_item.added", output_index=index, item=dict(item))
            yield turn.event("response.mcp_call_arguments.done", **where, arguments=item["arguments"])
        if servers.ran >= servers.limit:
            refused_call(item, servers.limit)
        else:
            servers.ran += 1
            yield turn.event("response.mcp_call.in_progress", **where)
            async with place.aside():
                await run_call(servers.settings, servers.listing.servers[item["server_label"]], item)
        yield turn.event(f"response.mcp_call.{'completed' if item['status'] == 'completed' else 'failed'}", **where)
        yield turn.event("response.output_item.done", output_index=index, item=dict(item))


def check_servers(listing: Listing | None, context: Sequence[Item]) -> None:
    """An approved call runs on its server, which the request must name among its tools."""
    for request in approved(context):
        if listing is None or request["server_label"] not in listing.servers:
            raise _bad("tools", f"The approved call '{request['id']}' runs on the MCP server "
                                f"{request['server_label']!r}, which no mcp tool of this request names; send "
                                "its mcp tool again.")


def next_choice(choice: Any, spent: bool) -> Any:
    """tool_choice for the pass after calls this server ran (MCP, file_search): a forced call was
    made, so the model now chooses (auto); past a call limit (``spent``), it must answer (none)."""
    if spent:
        return "none"
    if choice == "required" or (isinstance(choice, dict) and choice.get("type") in ("function", "mcp", "file_search")):
        return "auto"
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools" and choice.get("mode") == "required":
        return {**choice, "mode": "auto"}
    return choice
