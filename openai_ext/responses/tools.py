"""A Responses request's ``tools`` and ``tool_choice`` as the chat request's.

Function tools pass through. A ``namespace`` tool (OpenAI's grouping of function tools that the
client runs, as Codex CLI sends its shell and patch functions) is flattened: its functions stand
beside the others, and ``ToolMap`` remembers where each came from.

How the model sees a namespace's function: under the function's own name, which is what its
author wrote and what a small model copes with best. Only a name taken twice (by two namespaces,
or by a namespace and a top-level function) is shown as ``<namespace>__<name>`` instead, for the
namespaced ones; a top-level function always keeps its name. A call the model makes comes back
as a ``function_call`` item with the function's own ``name`` and its ``namespace``, and such
items sent back in a later turn are shown to the model under the name it called. Names over the
64 characters chat allows are cut, with a short digest to keep them apart.

An ``mcp`` tool's functions are those its server listed (mcp.py gives them, as ``listing``),
offered the same way under the server's label: shown under their own names unless taken twice,
``<label>__<name>`` then; ``mcp_of`` tells a call to one of them from a client's function.

A ``file_search`` tool is offered as the function ``file_search`` (file_search.py runs its calls);
``search`` holds the name it is shown under.

Other tools OpenAI runs on its own servers get a 400 naming them, with one exception: ``web_search``
with ``external_web_access: false`` (what Codex CLI sends unless told otherwise) may search only a
cache of pages it already has, and this server has none, so such a search could only ever come
back empty: the tool is accepted and not offered to the model, which answers from what it knows.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import InvalidRequestError
from . import file_search
from .mcp import Listing
from .mcp import echo as mcp_echo

# Tools OpenAI runs on its own servers (or that need a client protocol other than function calls).
HOSTED_TOOLS = {"web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
                "computer", "computer_use", "computer_use_preview", "code_interpreter",
                "image_generation", "local_shell", "shell", "apply_patch", "tool_search",
                "programmatic_tool_calling"}
SEPARATOR = "__"
_CHAT_NAME = 64                                   # the longest function name chat takes
_NAMESPACE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")   # as the spec has it on function_call_output
_MEMBER = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")     # FunctionToolParam's name
_UNSHOWABLE = re.compile(r"[^a-zA-Z0-9_-]")          # what chat's function names cannot hold (MCP's may: a dot)


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def hosted(param: str, kind: str) -> InvalidRequestError:
    cached = " (a web_search with external_web_access false, searching no live page, is accepted)" \
        if kind.startswith("web_search") else ""
    return _bad(param, f"'{kind}' is one of OpenAI's hosted tools, which run on OpenAI's servers; this server does "
                       "not run them. Remove it, or use function tools (type: function) and run the tool "
                       f"yourself{cached}.")


def _cache_only_search(tool: dict[str, Any]) -> bool:
    """A web search restricted to cached pages (see the module's notes): nothing to offer."""
    return tool.get("type") in ("web_search", "web_search_2025_08_26") and tool.get("external_web_access") is False


def _custom(param: str) -> InvalidRequestError:
    return _bad(param, f"{param} is a 'custom' tool, whose calls are free-form text; this server calls functions "
                       "with JSON arguments only. Send it as a function tool (type: function) with parameters.")


def _fit(name: str) -> str:
    if len(name) <= _CHAT_NAME:
        return name
    return f"{name[:_CHAT_NAME - 9]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def qualified(namespace: str, name: str) -> str:
    """The name a namespaced function is shown under when its own name is taken."""
    return _fit(f"{namespace}{SEPARATOR}{name}")


@dataclass
class _Entry:
    namespace: str | None
    name: Any                # as sent; a top-level function's name is checked by chat
    tool: dict[str, Any]
    path: str                # where it is in the request: tools[i] or tools[i].tools[j]
    description: str = ""
    mcp: bool = False        # a function of an MCP server (namespace: its label)
    search: bool = False     # the file_search tool


@dataclass
class ToolMap:
    chat: list[dict[str, Any]] = field(default_factory=list)     # chat's tools, in order
    paths: list[str] = field(default_factory=list)               # chat's tools[k] -> where it was sent
    origin: dict[str, tuple[str | None, str]] = field(default_factory=dict)   # shown name -> (namespace, name)
    shown: dict[tuple[str | None, str], str] = field(default_factory=dict)    # (namespace, name) -> shown name
    mcp: set[str] = field(default_factory=set)                    # shown names of MCP servers' tools
    listing: Listing | None = None                               # the MCP servers, and their tools
    search: str | None = None                                    # the shown name of file_search, if offered

    def mcp_of(self, shown: str) -> tuple[str, str] | None:
        """The server label and tool name of an MCP tool the model called as ``shown`` (None: a
        client's function)."""
        if shown not in self.mcp:
            return None
        label, name = self.origin[shown]
        assert label is not None
        return label, name

    def server_tools(self, label: str) -> list[str]:
        """The shown names of a server's offered tools."""
        return [shown for shown in self.mcp if self.origin[shown][0] == label]

    def call(self, shown: str) -> tuple[str | None, str]:
        """The namespace and the own name of the function the model called as ``shown``."""
        return self.origin.get(shown, (None, shown))

    def name_of(self, namespace: str | None, name: str) -> str:
        """The name an earlier call (a function_call item) is shown to the model under."""
        if namespace is None:
            return name
        return self.shown.get((namespace, name)) or qualified(namespace, name)

    def pick(self, choice: dict[str, Any], where: str) -> str:
        """The shown name of the function a tool_choice entry names: ``namespace.name`` (as
        OpenAI's SDKs name a namespaced function), the name the model sees, or a namespaced
        function's own name where only one namespace holds it."""
        name = choice.get("name")
        if not isinstance(name, str):
            raise _bad(f"{where}.name", f"{where} needs the name of a function tool.")
        if name in self.origin:
            return name
        namespace, dot, own = name.rpartition(".")
        if dot and (namespace, own) in self.shown:
            return self.shown[(namespace, own)]
        held = sorted(key for key in self.shown if key[0] is not None and key[1] == name)
        if len(held) > 1:
            raise _bad(f"{where}.name", f"{where} names the function {name!r}, which several namespaces hold; name "
                                        f"one of {', '.join(f'{ns}.{own}' for ns, own in held)}.")
        return self.shown[held[0]] if held else name


def _members(tool: dict[str, Any], i: int) -> list[_Entry]:
    where = f"tools[{i}]"
    namespace = tool.get("name")
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise _bad(f"{where}.name", f"{where} is a namespace and needs a name of 1-64 letters, digits, underscores "
                                    "or dashes.")
    about = tool.get("description")
    if about is not None and not isinstance(about, str):
        raise _bad(f"{where}.description", f"{where}.description must be a string.")
    members = tool.get("tools")
    if not isinstance(members, list) or not members:
        raise _bad(f"{where}.tools", f"{where} is a namespace and needs tools: a non-empty list of function tools.")
    out = []
    for j, member in enumerate(members):
        here = f"{where}.tools[{j}]"
        kind = member.get("type") if isinstance(member, dict) else None
        if kind == "custom":
            raise _custom(here)
        if kind != "function":
            raise _bad(f"{here}.type", f"{here} has type {kind!r}; a namespace holds function tools (type: function).")
        name = member.get("name")
        if not isinstance(name, str) or not _MEMBER.match(name):
            raise _bad(f"{here}.name", f"{here} needs a name of 1-128 letters, digits, underscores or dashes.")
        # the namespace's description is shown to the model with each of its functions
        text = " ".join(t for t in (about, member.get("description")) if isinstance(t, str) and t)
        out.append(_Entry(namespace, name, member, here, text))
    return out


def _server(tool: dict[str, Any], i: int, listing: Listing | None) -> list[_Entry]:
    """An mcp tool's functions: what its server listed, allowed_tools applied."""
    label = tool.get("server_label")
    if listing is None or label not in listing.servers:
        raise _bad(f"tools[{i}]", f"tools[{i}] is an mcp tool, which is not available here.")
    about = listing.servers[label].description
    return [_Entry(label, t["name"], {"parameters": t.get("input_schema") or {"type": "object", "properties": {}}},
                   f"tools[{i}]", " ".join(x for x in (about, t.get("description")) if isinstance(x, str) and x),
                   mcp=True)
            for t in listing.offered(label)]


def _entries(tools: list[Any], listing: Listing | None = None) -> list[_Entry]:
    out: list[_Entry] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        kind = kind if isinstance(kind, str) else None   # a list or an object is no type (and unhashable)
        if kind == "namespace":
            out += _members(tool, i)
        elif kind == "mcp":
            out += _server(tool, i, listing)
        elif _cache_only_search(tool):
            continue
        elif kind == file_search.NAME:
            out.append(_Entry(None, file_search.NAME, {"parameters": file_search.PARAMETERS}, where,
                              file_search.DESCRIPTION, search=True))
        elif kind in HOSTED_TOOLS:
            raise hosted(where, kind)
        elif kind == "custom":
            raise _custom(where)
        elif kind != "function":
            raise _bad(f"{where}.type", f"{where} has type {kind!r}; only function tools (and namespaces of "
                                        "function tools) are supported here.")
        else:
            out.append(_Entry(None, tool.get("name"), tool, where, tool.get("description") or ""))
    return out


def build(tools: list[Any] | None, listing: Listing | None = None) -> ToolMap:
    """The chat request's tools for ``tools``, and the way back from the names the model sees.
    ``listing``: the tools of the request's MCP servers (mcp.list_servers)."""
    entries = _entries(tools or [], listing)
    namespaces = {e.namespace for e in entries if e.namespace is not None and not e.mcp}
    clash = next((e for e in entries if e.mcp and e.namespace in namespaces), None)
    if clash is not None:
        raise _bad(f"{clash.path}.server_label", f"{clash.path}.server_label {clash.namespace!r} is also the name "
                                                 "of a namespace tool; rename one of them.")
    taken = Counter(e.name for e in entries if isinstance(e.name, str))
    if any(e.search for e in entries) and taken[file_search.NAME] > 1:
        clash = next(e for e in entries if e.name == file_search.NAME and not e.search)
        raise _bad(f"{clash.path}.name", f"{clash.path} is a function named {file_search.NAME!r}, as the file_search "
                                         "tool is shown to the model; rename the function.")
    out = ToolMap(listing=listing)
    owner: dict[str, str] = {}
    for e in entries:
        shown = e.name
        if e.namespace is not None:
            own = _UNSHOWABLE.sub("_", e.name) if e.mcp else e.name
            shown = _fit(own) if taken[e.name] == 1 else qualified(e.namespace, own)
            if shown in owner:
                raise _bad(e.path, f"{e.path} is shown to the model as {shown!r}, and so is {owner[shown]}; rename "
                                   "one of them.")
        if isinstance(shown, str):
            owner.setdefault(shown, e.path)   # two top-level functions of one name are chat's 400
            out.origin[shown] = (e.namespace, e.name)
            out.shown[(e.namespace, e.name)] = shown
            if e.mcp:
                out.mcp.add(shown)
            if e.search:
                out.search = shown
        out.chat.append({"type": "function", "function": {"name": shown, "description": e.description,
                                                          "parameters": e.tool.get("parameters")}})
        out.paths.append(e.path)
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None, tools: ToolMap | None = None) -> str | dict[str, Any] | None:
    """``tool_choice`` in chat's shape, naming functions as the model sees them."""
    tools = tools or ToolMap()
    if choice is None or isinstance(choice, str):
        if choice not in (None, "none", "auto", "required"):
            raise _bad("tool_choice", f"tool_choice {choice!r} is not one of none, auto, required.")
        return choice
    kind = choice.get("type")
    if kind == "function":
        return {"type": "function", "function": {"name": tools.pick(choice, "tool_choice")}}
    if kind == "mcp":
        names = _mcp_choice(choice, tools, "tool_choice")
        if len(names) == 1:
            return {"type": "function", "function": {"name": names[0]}}
        return {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": n}} for n in names]}}
    if kind == file_search.NAME:
        return {"type": "function", "function": {"name": _search_name(tools, "tool_choice")}}
    if kind == "allowed_tools":
        picked = []
        for j, t in enumerate(choice.get("tools") or []):
            where = f"tool_choice.tools[{j}]"
            if isinstance(t, dict) and t.get("type") == file_search.NAME:
                picked.append({"type": "function", "function": {"name": _search_name(tools, where)}})
                continue
            if isinstance(t, dict) and t.get("type") == "mcp":
                picked += [{"type": "function", "function": {"name": n}} for n in _mcp_choice(t, tools, where)]
                continue
            if not isinstance(t, dict) or t.get("type") != "function":
                if isinstance(t, dict) and isinstance(t.get("type"), str) and t["type"] in HOSTED_TOOLS:
                    raise hosted(where, t["type"])
                raise _bad(where, "allowed_tools lists function tools: {type: function, name}.")
            picked.append({"type": "function", "function": {"name": tools.pick(t, where)}})
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": picked}}
    if isinstance(kind, str) and kind in HOSTED_TOOLS:
        raise hosted("tool_choice", kind)
    if kind == "custom":
        raise _custom("tool_choice")
    raise _bad("tool_choice", "tool_choice must be none, auto, required, {type: function, name} or "
                              "{type: allowed_tools, mode, tools}.")


def _search_name(tools: ToolMap, where: str) -> str:
    if tools.search is None:
        raise file_search.bad_choice(where)
    return tools.search


def _mcp_choice(choice: dict[str, Any], tools: ToolMap, where: str) -> list[str]:
    """The shown names an {type: mcp, server_label, name?} choice picks: the named tool, or
    (no name) every tool its server offers."""
    label = choice.get("server_label")
    if tools.listing is None or label not in tools.listing.servers:
        raise _bad(f"{where}.server_label", f"{where} picks the MCP server {label!r}, which no mcp tool of this "
                                            "request names; send an mcp tool with that server_label.")
    name = choice.get("name")
    if name is None:
        names = tools.server_tools(label)
        if not names:
            raise _bad(where, f"{where} picks the MCP server {label!r}, which offers no tools.")
        return sorted(names)
    shown = tools.shown.get((label, name)) if isinstance(name, str) else None
    if shown is None or shown not in tools.mcp:
        offered = ", ".join(sorted(tools.origin[s][1] for s in tools.server_tools(label))) or "none"
        raise _bad(f"{where}.name", f"{where} names the tool {name!r}, which the MCP server {label!r} does not offer "
                                    f"here (it offers: {offered}).")
    return [shown]


def echo(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The tools as a Response object repeats them (strict defaults to true in this API)."""
    def function(t: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "name": t.get("name"), "description": t.get("description"),
                "parameters": t.get("parameters"), "strict": t.get("strict", True) is not False}

    def one(t: dict[str, Any]) -> dict[str, Any]:
        if t.get("type") == "namespace":
            return {"type": "namespace", "name": t.get("name"), "description": t.get("description") or "",
                    "tools": [function(m) for m in t.get("tools") or []]}
        if _cache_only_search(t) or t.get("type") == file_search.NAME:
            return dict(t)   # accepted as sent (see the module's notes)
        if t.get("type") == "mcp":
            return mcp_echo(t)
        return function(t)

    return [one(t) for t in tools or []]
