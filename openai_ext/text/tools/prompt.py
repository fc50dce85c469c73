"""Tools in the prompt: rendered by a chat template that knows the <tool_call> format, or by the
documented fallback (a system message that lists the tools and teaches the format)."""

from __future__ import annotations

import json
from typing import Any

from .spec import CALL_CLOSE, CALL_OPEN, ToolSet


def template_is_native(template: str | None) -> bool:
    """A template that renders tools and writes calls in the <tool_call> format itself. Templates
    with a tool format of their own are not recognised: they get the fallback."""
    return bool(template and "tools" in template and CALL_OPEN in template)


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
    out: list[dict[str, Any]] = []
    if native:
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                # templates expect arguments as objects, as the transformers convention has it
                m["tool_calls"] = [{**tc, "function": {**tc["function"], "arguments": _loads_or_keep(
                    tc["function"]["arguments"])}} for tc in m["tool_calls"]]
            out.append(m)
        tools = [t.as_openai() for t in ts.tools if t.name in ts.allowed] if ts and ts.calling else None
        return out, tools

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
