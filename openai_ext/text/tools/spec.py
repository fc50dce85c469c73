"""The request's tools: OpenAI ``tools``/``tool_choice``/``parallel_tool_calls`` (or the legacy
``functions``/``function_call``), read and checked as OpenAI checks them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from ...core.errors import PARAM, InvalidRequestError
from ..grammar.errors import MAX_SCHEMA_NODES, check_depth, check_schema
from .validation import CallValidator

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    validator: Draft202012Validator
    param_path: str              # where the parameters are in the request, for errors
    strict: bool = False         # strict: true: a keyword the grammar cannot enforce is a 400
    exact: bool = True           # the call grammar enforces the whole schema (else calls are held and
                                 # validated before they are sent: see call_grammar, ToolCallStream)

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass
class ToolSet:
    tools: list[Tool]
    choice: str                  # "auto", "required" or "none"
    allowed: list[str]           # names the model may call now
    parallel: bool
    legacy: bool = False         # the request used functions/function_call: answer in that shape
    prefill: str = ""            # the start of the first call, written into the prompt (named_call_prefill)
    by_name: dict[str, Tool] = field(init=False)

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.tools}

    @property
    def calling(self) -> bool:
        return self.choice != "none" and bool(self.allowed)

    @property
    def forced(self) -> bool:
        return self.choice == "required"

    @property
    def param(self) -> str:
        return "functions" if self.legacy else "tools"


def _bad(param: str, message: str, **paths: str) -> InvalidRequestError:
    """A 400; ``paths`` and {param} name request paths in the message (see core.errors)."""
    return InvalidRequestError(message, param=param, paths=paths)


def parse(req) -> ToolSet | None:
    """Reads tools/tool_choice/parallel_tool_calls, or the legacy functions/function_call,
    and checks them as OpenAI does."""
    legacy = bool(req.functions)
    if legacy and req.tools:
        raise _bad("functions", "Send either tools or the legacy functions, not both.")
    if req.parallel_tool_calls is not None and not req.tools:
        raise _bad("parallel_tool_calls", f"{PARAM} is only allowed when tools are specified.")
    if legacy and req.tool_choice is not None:
        raise _bad("tool_choice", "tool_choice goes with tools; with the legacy functions, use function_call "
                                  "(or send tools instead of functions).")
    if legacy:
        raw_tools = [{"type": "function", "function": f} for f in req.functions]
        choice_raw, choice_param, tools_param = req.function_call, "function_call", "functions"
        if isinstance(choice_raw, dict):
            choice_raw = {"type": "function", "function": choice_raw}
    else:
        raw_tools = req.tools or []
        choice_raw, choice_param, tools_param = req.tool_choice, "tool_choice", "tools"
        if req.function_call not in (None, "none", "auto"):
            raise _bad("function_call", "function_call needs functions; with tools, use tool_choice.")
    if not raw_tools:
        if choice_raw not in (None, "none"):
            raise _bad(choice_param, f"{choice_param} is only allowed when {tools_param} are given.")
        return None

    tools: list[Tool] = []
    room = MAX_SCHEMA_NODES     # objects and lists all the functions' parameters may hold together
    for i, item in enumerate(raw_tools):
        where = f"{tools_param}[{i}]" if not legacy else f"functions[{i}]"
        if not isinstance(item, dict) or item.get("type") != "function" or not isinstance(item.get("function"), dict):
            raise _bad(where, f"{PARAM} must be {{\"type\": \"function\", \"function\": {{...}}}}; "
                              "only function tools are supported.")
        fn = item["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(f"{where}.function.name" if not legacy else f"{where}.name",
                       "{tool} needs a name of 1-64 letters, digits, underscores or dashes.", tool=where)
        params = fn.get("parameters") or _NO_PARAMETERS
        ppath = f"{where}.function.parameters" if not legacy else f"{where}.parameters"
        if not isinstance(params, dict):
            raise _bad(ppath, f"{PARAM} must be a JSON Schema object.")
        room -= check_depth(params, ppath, room=room)   # before the validator walks it
        check_schema(params, ppath)
        validator = CallValidator(params)
        if any(t.name == name for t in tools):
            raise _bad(where, f"Two functions are named {name!r}; names must be unique.")
        tools.append(Tool(name, str(fn.get("description") or ""), params, validator, ppath, fn.get("strict") is True))

    names = [t.name for t in tools]
    choice, allowed = "auto", names
    if choice_raw is None or choice_raw == "auto":
        pass
    elif choice_raw in ("none", "required"):
        choice = choice_raw
    elif isinstance(choice_raw, dict) and choice_raw.get("type") == "function":
        wanted = (choice_raw.get("function") or {}).get("name")
        if wanted not in names:
            raise _bad(choice_param, f"{choice_param} names the function {wanted!r}, which is not among the "
                                     f"{tools_param}: {', '.join(names)}.")
        choice, allowed = "required", [wanted]
    elif isinstance(choice_raw, dict) and choice_raw.get("type") == "allowed_tools":
        spec = choice_raw.get("allowed_tools") or {}
        mode = spec.get("mode", "auto")
        picked = [(t.get("function") or {}).get("name") for t in spec.get("tools") or [] if isinstance(t, dict)]
        known = [p for p in picked if isinstance(p, str) and p in names]
        if mode not in ("auto", "required") or not picked or len(known) < len(picked):
            raise _bad(choice_param, "allowed_tools needs mode 'auto' or 'required' and a non-empty list of "
                                     "functions that are among the tools.")
        choice, allowed = mode, known
    else:
        raise _bad(choice_param, f"{choice_param} must be 'none', 'auto', 'required' or "
                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}.")
    parallel = req.parallel_tool_calls is not False and not legacy and len(allowed) > 0
    if choice_raw is not None and isinstance(choice_raw, dict) and choice_raw.get("type") == "function":
        parallel = False  # a named function is called once
    return ToolSet(tools, choice, allowed, parallel, legacy)
