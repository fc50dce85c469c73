"""The grammar of tool calls: every call well-formed and valid against its function's schema."""

from __future__ import annotations

from typing import Any

from .. import grammar
from .spec import CALL_CLOSE, CALL_OPEN, ToolSet


def call_grammar(ts: ToolSet, *, response: tuple[Any, str, bool] | None = None, lazy: bool = False) -> str:
    """GBNF for one call block (or several, with parallel calls) of the allowed functions.

    ``lazy``: the grammar of what follows an opening marker the model wrote itself (the host
    applies it from CALL_OPEN on). ``response``: (schema, where it is in the request): the answer
    may instead be JSON of that schema (response_format next to tool_choice "auto"); the last item
    says whether that schema is strict.
    """
    defs: dict[str, Any] = {}
    calls = []
    for i, t in enumerate(ts.tools):
        if t.name in ts.allowed:
            # Each function's schema keeps its own definitions: its references are renamed apart.
            prepared = grammar.prepare(t.parameters, t.param_path, prefix=f"fn{i}-", strict=t.strict)
            defs.update(prepared.defs)
            calls.append({"type": "object", "properties": {"name": {"const": t.name}, "arguments": prepared.schema},
                          "required": ["name", "arguments"]})
    rules: dict[str, Any] = {"tool-call": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if response is not None:
        prepared = grammar.prepare(response[0], response[1], prefix="answer-", strict=response[2])
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
