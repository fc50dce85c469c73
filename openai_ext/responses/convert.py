"""A Responses request, with the items before it, as the text family's chat request.

The history (a previous response's items, or a conversation's), the instructions and the new input
items become chat messages; ``text.format``, ``tools``, ``tool_choice`` and the sampling parameters
become their chat counterparts. ``chat.prepare()`` then renders, tokenizes and plans it exactly as
for /v1/chat/completions, so templates, tools, grammars and ``params.plan()`` are shared, not
copied. The paths its errors name are renamed to those the client sent (``messages`` -> ``input``,
``response_format`` -> ``text.format`` ...).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..core.errors import ContextLengthExceeded, InvalidRequestError, PathNames, renamed
from ..text import chat, fitting
from ..text.generation import Job
from ..text.protocol import ChatCompletionRequest
from ..text.service import TextService
from . import compaction, file_search, images, mcp
from . import tools as tools_
from .item_types import Item, Items
from .protocol import CreateResponse, InputTokensRequest

LOGPROBS = "message.output_text.logprobs"

# chat's request paths, as the client sent them here (tools[k] is renamed first: see translate)
CHAT_PATHS = PathNames((r"response_format\.json_schema\.schema", "text.format.schema"),
                       (r"response_format\.json_schema", "text.format"),
                       (r"response_format", "text.format"),
                       (r"max_completion_tokens", "max_output_tokens"),
                       (r"messages", "input"),
                       (r"logprobs", "include"))
_TOOL = re.compile(r"tools\[(\d+)\](?:\.function)?(?=[.\[]|$)")   # chat's tools[k] or tools[k].function
# A prompt too long for the context is cut when the request asks for it (truncation: auto).
WORDS = {"remedy": 'send truncation: "auto" to drop the oldest input items'}


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def chat_messages(instructions: str | None, items: Sequence[Item],
                  tools: tools_.ToolMap | None = None) -> list[dict[str, Any]]:
    """Items as chat turns: the model's calls join the assistant turn they belong to (a
    namespaced call under the name the model sees it by), and function outputs become tool
    messages. Reasoning items are kept in the store, not shown; images are chat's image parts."""
    tools = tools or tools_.ToolMap()
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    declined = mcp.declined(items)

    def call(call_id: str, name: str, arguments: str) -> None:
        """A call of the model's: it joins the assistant turn before it, if any."""
        made = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        last = out[-1] if out else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(made)
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": [made]})

    def called(call_id: str, name: str, arguments: str, result: str) -> None:
        """A call this server ran (an MCP tool's), and its result."""
        call(call_id, name, arguments)
        out.append({"role": "tool", "tool_call_id": call_id, "content": result})

    for it in items:
        if it["type"] == "compaction_summary":
            # What a compaction item stands for joins the system message, which every chat
            # template places first, rather than a turn the model might answer.
            note = f"Summary of the conversation so far:\n{it['text']}"
            if out and out[0]["role"] == "system":
                out[0]["content"] = f"{out[0]['content']}\n\n{note}"
            else:
                out.insert(0, {"role": "system", "content": note})
        elif it["type"] == "message":
            out.append({"role": it["role"], "content": images.chat_content(it["content"])})
        elif it["type"] == "function_call":
            call(it["call_id"], tools.name_of(it.get("namespace"), it["name"]), it["arguments"])
        elif it["type"] == "function_call_output":
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": images.chat_content(it["output"])})
        elif it["type"] == "mcp_call" and it.get("status") in ("completed", "failed"):
            error = it.get("error")
            result = it.get("output") if error is None else mcp.error_text(error)
            called(it["id"], tools.name_of(it["server_label"], it["name"]), it["arguments"], result or "")
        elif it["type"] == "mcp_approval_request" and it["id"] in declined:
            reason = declined[it["id"]]
            called(it["id"], tools.name_of(it["server_label"], it["name"]), it["arguments"],
                   mcp.DECLINED + (f" Reason: {reason}" if reason else ""))
        elif it["type"] == "file_search_call" and it.get("status") in ("completed", "failed"):
            called(it["id"], tools.search or file_search.NAME, file_search.arguments_of(it), file_search.for_model(it))
        # mcp_list_tools: its tools are offered as tools; an approval request is shown once run
        # (as its mcp_call) or declined; an approval response by what it decided
    return out


def response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str):
            raise _bad("text.format.name", "text.format of type json_schema needs a name.")
        if not isinstance(fmt.get("schema"), dict):
            raise _bad("text.format.schema", "text.format of type json_schema needs a schema (a JSON Schema object).")
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise _bad("text.format.type", f"text.format type {kind!r} is not one of text, json_object, json_schema.")


def host_extras(body: CreateResponse | InputTokensRequest) -> dict[str, Any]:
    """The extra fields chat takes (host samplers and the web UI's fields) go on to params.plan(),
    as in chat; the request model refused any other (or the allow_unknown_fields setting let it
    pass, and it is left out here)."""
    return {k: v for k, v in (body.model_extra or {}).items() if k in type(body).passes}


def to_chat(body: CreateResponse | InputTokensRequest, items: Sequence[Item], *,
            tools: tools_.ToolMap | None = None) -> ChatCompletionRequest:
    """The chat request for ``items`` (the history, then the new input) and the body's parameters;
    ``tools`` is ``tools.build(body.tools)``, when already built."""
    tools = tools if tools is not None else tools_.build(body.tools)
    messages = chat_messages(body.instructions, items, tools)
    if not any(m["role"] != "system" for m in messages):
        raise _bad("input", "There is nothing to answer: send input (a string or items), or continue a "
                            "conversation or a previous response.")
    s = body if isinstance(body, CreateResponse) else None   # a token count samples nothing
    logprobs = s is not None and (LOGPROBS in (s.include or []) or s.top_logprobs is not None)
    if body.tools:
        choice = tools_.chat_tool_choice(body.tool_choice, tools)
        limit = None if s is None else s.max_tool_calls
        parallel = False if limit == 1 else body.parallel_tool_calls
        choice = "none" if limit == 0 else choice
    else:
        choice, parallel = tools_.chat_tool_choice(body.tool_choice), None
        if choice not in (None, "none", "auto"):
            raise _bad("tool_choice", "tool_choice names a tool, but there are no tools; send tools or remove "
                                      "tool_choice.")
        choice = None
    return ChatCompletionRequest(
        messages=messages, model=body.model,
        temperature=None if s is None else s.temperature, top_p=None if s is None else s.top_p,
        max_completion_tokens=None if s is None else s.max_output_tokens,
        presence_penalty=None if s is None else s.presence_penalty,
        frequency_penalty=None if s is None else s.frequency_penalty,
        logprobs=True if logprobs else None,
        top_logprobs=((s.top_logprobs if s is not None else None) or 0) if logprobs else None,
        # reaches the chat template as in chat
        reasoning_effort=s.reasoning.effort if s is not None and s.reasoning is not None else None,
        response_format=response_format(body.text.format if body.text is not None else None),
        tools=tools.chat if body.tools else None, tool_choice=choice, parallel_tool_calls=parallel,
        **host_extras(body))


def translate(err: InvalidRequestError, paths: list[str] | None = None) -> InvalidRequestError:
    """A chat error, with the paths it names (its param, and those of its message) as the client
    sent them here. ``paths``: where chat's tools[k] was sent (a namespace's functions are
    flattened, so the indices differ)."""

    def name(path: str) -> str:
        m = _TOOL.match(path)
        if m is None:
            return CHAT_PATHS(path)
        k = int(m.group(1))
        return (paths[k] if paths is not None and k < len(paths) else f"tools[{k}]") + path[m.end():]

    return renamed(err, name, WORDS)


def starts(items: Sequence[Item]) -> list[int]:
    """Where the context may start, oldest first: dropping an item drops with it what only made
    sense after it (outputs of its calls, reasoning), so some indices are skipped."""
    out, i = [0], 0
    while i < len(items) - 1:
        i += 1
        while i < len(items) - 1 and items[i]["type"] in ("function_call_output", "reasoning"):
            i += 1
        out.append(i)
    return out


def prepare(text: TextService, body: CreateResponse | InputTokensRequest, history: Items,
            items: Items, *, tools: tools_.ToolMap | None = None) -> Job:
    """chat.prepare() on the request; with truncation auto, the oldest items (history first) are
    dropped until the prompt fits (text.fitting: a few tries, each refused cheaply, before
    tokenizing, when far too long)."""
    context = compaction.expand([*history, *items])
    tools = tools if tools is not None else tools_.build(body.tools)

    def attempt(start: int) -> Job:
        # to_chat's errors name our fields already
        req = to_chat(body, context[start:], tools=tools)
        try:
            return chat.prepare(text, req, truncate=False)
        except ContextLengthExceeded:
            raise   # the cut moves, or the caller translates it
        except InvalidRequestError as e:
            raise translate(e, tools.paths) from None

    try:
        return fitting.fit(starts(context) if body.truncation == "auto" else [0], attempt)
    except ContextLengthExceeded as e:
        raise translate(e) from None


def again(text: TextService, body: CreateResponse, context: tuple[Items, Items],
          produced: Items, update: dict[str, Any], *,
          tools: tools_.ToolMap) -> Job:
    """The job of a response's next pass, once its MCP calls ran: the context (history and input,
    or the compacted context), then what the response has produced so far; ``update``: the
    request's fields for this pass (tool_choice, the tokens left)."""
    history, items = context
    return prepare(text, body.model_copy(update=update), history, [*items, *produced],
                   tools=tools)
