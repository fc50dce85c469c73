"""The grammar of tool calls: every call well-formed and valid against its function's schema."""

from __future__ import annotations

import json
from typing import Any

from .. import grammar
from .spec import CALL_CLOSE, CALL_OPEN, Tool, ToolSet


def named_call_prefill(ts: ToolSet) -> str:
    """With one function forced (a named tool_choice), everything before its arguments is known:
    the server writes it into the prompt instead of spending the model's tokens on it (18 tokens
    for get_weather with the embedded model), so a call fits a budget as small as at OpenAI, and
    ToolCallStream is fed it first. "" when the call's name is the model's choice."""
    if not (ts.forced and len(ts.allowed) == 1):
        return ""
    return f'{CALL_OPEN}\n{{"name": {json.dumps(ts.allowed[0], ensure_ascii=False)}, "arguments": '


def call_grammar(ts: ToolSet, *, response: tuple[Any, str, bool] | None = None, lazy: bool = False,
                 prefilled: bool = False) -> str:
    """GBNF for one call block (or several, with parallel calls) of the allowed functions.

    ``lazy``: the grammar of what follows an opening marker the model wrote itself (the host
    applies it from CALL_OPEN on). ``prefilled``: what follows named_call_prefill(): the one
    function's arguments, the brace that closes the call, and (with parallel calls) its closing
    marker and any further calls; without them the model stops at that brace, and the call's
    closing marker costs no token either. ``response``: (schema, where it is in the request): the answer
    may instead be JSON of that schema (response_format next to tool_choice "auto"); the last item
    says whether that schema is strict.

    All the schemas share the request's budget (grammar.limits), strict ones first: a strict
    schema beyond it is a 400 naming it; any other is relaxed (``Tool.exact`` becomes false), and
    its calls are validated after generation, as every call is.
    """
    g = grammar.Grammar()
    allowed = [(i, t) for i, t in enumerate(ts.tools) if t.name in ts.allowed]
    jobs: list[tuple[bool, str, Tool | tuple[Any, str, bool]]] = [(t.strict, f"fn{i}-arguments", t) for i, t in allowed]
    if response is not None:
        jobs.append((response[2], "response", response))
    for strict, name, job in sorted(jobs, key=lambda j: not j[0]):   # strict schemas first
        if isinstance(job, tuple):
            grammar.write_schema(g, name, job[0], job[1], strict=strict, prefix="answer-")
        else:
            prefix = name.removesuffix("arguments")
            job.exact = grammar.write_schema(g, name, job.parameters, job.param_path, strict=strict,
                                             prefix=prefix, checked=True).exact
    # {"name": ..., "arguments": ...}: the names as a tree, so any number of functions costs one
    # alternative at a time
    g.use("j-ws")
    g.tree("tool-call-name", [(json.dumps(t.name, ensure_ascii=False),
                               f'"," j-ws "\\"arguments\\"" j-ws ":" j-ws fn{i}-arguments "}}" j-ws')
                              for i, t in allowed])
    more = " (tool-ws tool-call-block)*" if ts.parallel else ""
    if prefilled:   # the one allowed function's arguments, after named_call_prefill()
        closing = f' tool-ws {grammar.gbnf_literal(CALL_CLOSE)}{more}' if ts.parallel else ""
        root = f'root ::= fn{allowed[0][0]}-arguments tool-ws "}}"{closing}'
    elif lazy:
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
        'tool-call ::= "{" j-ws "\\"name\\"" j-ws ":" j-ws tool-call-name',
        g.text()])
