"""Tool calling: OpenAI ``tools`` in, ``tool_calls`` out.

Wire format. Calls are written the way Hermes-style chat templates (Qwen2.5, Hermes, ...) teach
their models::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A template that knows this format renders the tools and the tool messages itself. Any other
template gets the documented fallback: the tool list and this format are described in a system
message, earlier calls are written into assistant messages in this format, and tool results are
given back as user messages wrapped in ``<tool_response>``.

Only templates that contain the ``<tool_call>`` marker count as knowing this format; a template
that renders tools in another format (Llama 3's JSON, Mistral's [TOOL_CALLS] ...) gets the
fallback, so the model is always taught the one format parsed here.

Guarantees. With ``tool_choice`` "required" or a named function, decoding follows a grammar built
from the functions' parameter schemas, so every call is well-formed and valid. With "auto", the
embedded host applies the same grammar from the moment the model writes the opening marker
(``grammar_triggers``); any call is then parsed and validated against its schema, and text that is
not a valid call is returned as content, never as a broken call. With ``parallel_tool_calls``
false, whatever follows the first call is dropped.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from . import grammar
from .errors import InvalidRequestError

log = logging.getLogger(__name__)

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


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def parse(req) -> ToolSet | None:
    """Reads tools/tool_choice/parallel_tool_calls, or the legacy functions/function_call,
    and checks them as OpenAI does."""
    legacy = bool(req.functions)
    if legacy and req.tools:
        raise _bad("functions", "Send either tools or the legacy functions, not both.")
    if req.parallel_tool_calls is not None and not req.tools:
        raise _bad("parallel_tool_calls", "parallel_tool_calls is only allowed when tools are specified.")
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

    tools = []
    for i, item in enumerate(raw_tools):
        where = f"{tools_param}[{i}]" if not legacy else f"functions[{i}]"
        if not isinstance(item, dict) or item.get("type") != "function" or not isinstance(item.get("function"), dict):
            raise _bad(where, f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}; "
                              "only function tools are supported.")
        fn = item["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(f"{where}.function.name" if not legacy else f"{where}.name",
                       f"{where} needs a name of 1-64 letters, digits, underscores or dashes.")
        params = fn.get("parameters") or _NO_PARAMETERS
        ppath = f"{where}.function.parameters" if not legacy else f"{where}.parameters"
        if not isinstance(params, dict):
            raise _bad(ppath, f"{ppath} must be a JSON Schema object.")
        try:
            validator = Draft202012Validator(params)
            Draft202012Validator.check_schema(params)
        except SchemaError as e:
            here = ppath + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
            raise _bad(here, f"{here} is not a valid JSON Schema: {e.message}") from None
        if any(t.name == name for t in tools):
            raise _bad(where, f"Two functions are named {name!r}; names must be unique.")
        tools.append(Tool(name, str(fn.get("description") or ""), params, validator, ppath))

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
        unknown = [p for p in picked if p not in names]
        if mode not in ("auto", "required") or not picked or unknown:
            raise _bad(choice_param, "allowed_tools needs mode 'auto' or 'required' and a non-empty list of "
                                     "functions that are among the tools.")
        choice, allowed = mode, picked
    else:
        raise _bad(choice_param, f"{choice_param} must be 'none', 'auto', 'required' or "
                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}.")
    parallel = req.parallel_tool_calls is not False and not legacy and len(allowed) > 0
    if choice_raw is not None and isinstance(choice_raw, dict) and choice_raw.get("type") == "function":
        parallel = False  # a named function is called once
    return ToolSet(tools, choice, allowed, parallel, legacy)


# --- prompt ---------------------------------------------------------------------------------

def template_is_native(template: str | None) -> bool:
    """A template that renders tools and writes calls in the <tool_call> format itself. Templates
    with a tool format of their own are not recognised: they get the fallback."""
    return bool(template) and "tools" in template and CALL_OPEN in template


def _call_text(name: str, arguments: Any) -> str:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'{CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n{CALL_CLOSE}'


def fallback_instructions(ts: ToolSet) -> str:
    listed = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                  ensure_ascii=False) for t in ts.tools if t.name in ts.allowed)
    must = "You must call one of them now." if ts.forced else \
        "Call one when it helps; otherwise answer in plain text."
    many = " You may write several calls, one after another." if ts.parallel else ""
    return (f"You can call these functions (their arguments follow the JSON Schema given):\n{listed}\n"
            f"{must} To call a function, reply with nothing but:\n"
            f'{CALL_OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n{CALL_CLOSE}'
            f"{many}")


def for_template(messages: list[dict[str, Any]], ts: ToolSet | None, *, native: bool
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages (and the tools argument) to hand to the chat template."""
    has_tool_turns = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if ts is None and not has_tool_turns:
        return messages, None
    if native:
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                # templates expect arguments as objects, as the transformers convention has it
                m["tool_calls"] = [{**tc, "function": {**tc["function"], "arguments": _loads_or_keep(
                    tc["function"]["arguments"])}} for tc in m["tool_calls"]]
            out.append(m)
        tools = [t.as_openai() for t in ts.tools if t.name in ts.allowed] if ts and ts.calling else None
        return out, tools

    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("tool_calls"):
            calls = "\n".join(_call_text(tc["function"]["name"], tc["function"]["arguments"]) for tc in m["tool_calls"])
            text = f"{m['content']}\n{calls}" if m.get("content") else calls
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(dict(m))
    for m in out:
        m.pop("_tool_results", None)
    if ts and ts.calling:
        instructions = fallback_instructions(ts)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out, None


def _loads_or_keep(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (TypeError, json.JSONDecodeError):
        return arguments


# --- grammar --------------------------------------------------------------------------------

def call_grammar(ts: ToolSet, *, response: tuple[Any, str] | None = None, lazy: bool = False) -> str:
    """GBNF for one call block (or several, with parallel calls) of the allowed functions.

    ``lazy``: the grammar of what follows an opening marker the model wrote itself (the host
    applies it from CALL_OPEN on). ``response``: (schema, where it is in the request): the answer
    may instead be JSON of that schema (response_format next to tool_choice "auto").
    """
    defs: dict[str, Any] = {}
    calls = []
    for i, t in enumerate(ts.tools):
        if t.name in ts.allowed:
            # Each function's schema keeps its own definitions: its references are renamed apart.
            prepared = grammar.prepare(t.parameters, t.param_path, prefix=f"fn{i}-")
            defs.update(prepared.defs)
            calls.append({"type": "object", "properties": {"name": {"const": t.name}, "arguments": prepared.schema},
                          "required": ["name", "arguments"]})
    rules: dict[str, Any] = {"tool-call": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if response is not None:
        prepared = grammar.prepare(response[0], response[1], prefix="answer-")
        defs.update(prepared.defs)
        rules["response"] = prepared.schema
    body = grammar.gbnf(rules, defs, where=ts.param)
    more = " (tool-ws tool-call-block)*" if ts.parallel else ""
    if lazy:
        root = f"root ::= tool-call-rest{more}"
    else:
        root = f"root ::= tool-call-block{more}" + (" | response" if response is not None else "")
    # The whitespace around a call is loose: the model may write the marker and the JSON in one
    # line, or with a blank line between.
    return "\n".join([
        root,
        f"tool-call-block ::= {grammar.gbnf_literal(CALL_OPEN)} tool-call-rest",
        f"tool-call-rest ::= tool-ws tool-call tool-ws {grammar.gbnf_literal(CALL_CLOSE)}",
        "tool-ws ::= ([ \\t\\n] ([ \\t\\n] [ \\t\\n]?)?)?",
        body])


# --- output ---------------------------------------------------------------------------------

@dataclass
class Content:
    text: str


@dataclass
class CallDelta:
    """Part of call ``index``: its start (id and name set, arguments "") or an arguments fragment."""
    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


class ToolCallStream:
    """Splits generated text into content and tool calls, as the text arrives.

    ``incremental``: stream each call's arguments while they are generated (used when a grammar
    guarantees the calls). Otherwise each call is held until it is complete, then validated, and
    sent as a call only if valid; anything else is sent as content. Without parallel calls,
    whatever follows the first call is dropped.
    """

    def __init__(self, ts: ToolSet, *, incremental: bool):
        self.ts = ts
        self.incremental = incremental
        self._buf = ""
        self._in_call = False
        self._call = ""                 # text of the open call after CALL_OPEN
        self._args_sent = 0             # characters of the open call's arguments already sent
        self._started: CallDelta | None = None
        self._blank = ""                # whitespace held back: between calls it is not content
        self.calls: list[dict[str, Any]] = []   # completed, valid calls, OpenAI-shaped

    # content ---------------------------------------------------------------------------------
    def feed(self, text: str) -> list[Content | CallDelta]:
        return self._content_first(self._feed(text))

    def _content_first(self, items: list[Content | CallDelta]) -> list[Content | CallDelta]:
        """Whitespace-only content is held until real content follows, so the blank lines around
        calls never reach the client as content."""
        out: list[Content | CallDelta] = []
        for item in items:
            if isinstance(item, Content):
                text = self._blank + item.text
                if text.strip():
                    self._blank = ""
                    out.append(Content(text))
                else:
                    self._blank = text
            else:
                out.append(item)
        return out

    @property
    def _done(self) -> bool:
        """No more may follow: one call was made, and calls are not parallel."""
        return bool(self.calls) and not self.ts.parallel

    def _feed(self, text: str) -> list[Content | CallDelta]:
        out: list[Content | CallDelta] = []
        self._buf += text
        while self._buf:
            if self._done:
                self._buf = ""
                break
            if not self._in_call:
                i = self._buf.find(CALL_OPEN)
                if i == -1:
                    keep = _partial_suffix(self._buf, CALL_OPEN)
                    if len(self._buf) > keep:
                        out.append(Content(self._buf[:len(self._buf) - keep]))
                        self._buf = self._buf[len(self._buf) - keep:]
                    break
                if i:
                    out.append(Content(self._buf[:i]))
                self._buf = self._buf[i + len(CALL_OPEN):]
                self._in_call, self._call, self._args_sent, self._started = True, "", 0, None
            else:
                j = self._buf.find(CALL_CLOSE)
                if j == -1:
                    keep = _partial_suffix(self._buf, CALL_CLOSE)
                    self._call += self._buf[:len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep:]
                    if self.incremental:
                        out.extend(self._stream_arguments())
                    break
                self._call += self._buf[:j]
                self._buf = self._buf[j + len(CALL_CLOSE):]
                self._in_call = False
                out.extend(self._close_call())
        return out

    def finish(self) -> list[Content | CallDelta]:
        """The generation ended: what is still held is content (a call cut short is not a call)."""
        out: list[Content | CallDelta] = []
        if self._in_call:
            if not self.incremental or self._started is None:
                out.append(Content(CALL_OPEN + self._call + self._buf))
        elif self._buf:
            out.append(Content(self._buf))
        self._buf, self._in_call = "", False
        out = self._content_first(out)
        if self._blank and not self.calls:
            out.append(Content(self._blank))
        self._blank = ""
        return out

    # calls -----------------------------------------------------------------------------------
    def _parse(self, text: str) -> tuple[str, Any] | None:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or set(obj) - {"name", "arguments", "parameters"}:
            return None
        name, args = obj.get("name"), obj.get("arguments", obj.get("parameters", {}))
        tool = self.ts.by_name.get(name) if isinstance(name, str) else None
        if tool is None or name not in self.ts.allowed or not isinstance(args, dict):
            return None
        if not tool.validator.is_valid(args):
            return None
        return name, args

    def _close_call(self) -> list[Content | CallDelta]:
        parsed = self._parse(self._call)
        if parsed is None:
            if self.incremental and self._started is not None:
                return self._finish_started()
            return [Content(CALL_OPEN + self._call + CALL_CLOSE)]
        name, args = parsed
        arguments = json.dumps(args, ensure_ascii=False) if not self.incremental else self._arguments_text()
        index = len(self.calls)
        call_id = self._started.id if self._started else f"call_{uuid.uuid4().hex[:24]}"
        self.calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        if self.incremental:
            return list(self._stream_arguments(final=True))
        return [CallDelta(index, "", id=call_id, name=name), *(CallDelta(index, part) for part in _fragments(arguments))]

    def _finish_started(self) -> list[Content | CallDelta]:
        """A streamed call that does not validate (a grammar rules this out). Its id, name and
        first arguments are out already, so it is finished as written rather than dropped, which
        would leave the client a half call and give its index to the next one."""
        assert self._started is not None
        log.warning("a streamed call to %s does not match its schema", self._started.name)
        self.calls.append({"id": self._started.id, "type": "function",
                           "function": {"name": self._started.name, "arguments": self._arguments_text()}})
        return list(self._stream_arguments(final=True))

    # incremental streaming of a call the grammar guarantees ------------------------------------
    _HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')

    def _arguments_text(self) -> str:
        m = self._HEAD.match(self._call)
        return _json_value_prefix(self._call[m.end():])[0] if m else ""

    def _stream_arguments(self, final: bool = False) -> Iterator[CallDelta]:
        m = self._HEAD.match(self._call)
        if not m:
            return
        index = len(self.calls) - (1 if final else 0)
        if self._started is None:
            self._started = CallDelta(index, "", id=f"call_{uuid.uuid4().hex[:24]}", name=json.loads(f'"{m.group(1)}"'))
            yield self._started
        value, _complete = _json_value_prefix(self._call[m.end():])
        if len(value) > self._args_sent:
            yield CallDelta(index, value[self._args_sent:])
            self._args_sent = len(value)


def _partial_suffix(text: str, marker: str) -> int:
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def _fragments(text: str, size: int = 24) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _json_value_prefix(text: str) -> tuple[str, bool]:
    """The longest prefix of ``text`` that belongs to the JSON value it starts with, and whether
    that value is complete. Strings and escapes are tracked so braces inside them do not count."""
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return text[:i + 1], True
            if depth < 0:
                return text[:i], True
    return text, False
