"""Input items: read, checked and put in the one shape they are stored and listed in.

A request's ``input`` (or a conversation's new items) is a list of items in any of the shapes
OpenAI accepts: easy messages (``{"role", "content"}`` with string content), full messages with
content parts, the model's own output items sent back (``function_call``, assistant messages with
``output_text`` parts, ``reasoning``), ``function_call_output`` and ``item_reference``. Each one
becomes the item OpenAI lists for it (``ItemResource``): an id, a status, and content parts
(``input_text`` for user, system and developer messages; ``output_text`` for the assistant's),
and ``input_image`` parts (images.py) where a user message or a function output holds images.

Every error names the item and the field, e.g. ``input[2].content[0].type``. The items a
compaction item keeps are read the same way, with the same checks, and named inside it, e.g.
``input[3].encrypted_content[0].role``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Callable, Literal, Union, cast

from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

from ..core.errors import InvalidRequestError, NotFoundError, from_validation_errors
from ..core.lists import cursor_page
from ..text.images import no_vision
from . import answers, compacted, images
from .item_types import (
    CompactionItem,
    CompactionTriggerItem,
    ContentPart,
    FileSearchCallItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    Items,
    MessageItem,
    ReasoningItem,
)

# The items of the mcp tool (mcp.py), sent back as they were made
MCP_ITEMS = ("mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response")
# The types of items that belong to OpenAI's hosted tools: this server never produces them and
# cannot act on them.
HOSTED_ITEMS = {"web_search_call", "computer_call", "computer_call_output",
                "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output",
                "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output", "custom_tool_call",
                "custom_tool_call_output", "tool_search_call", "tool_search_output", "additional_tools",
                "program", "program_output"}
KNOWN_ITEMS = ("message", "function_call", "function_call_output", "item_reference", "reasoning", "compaction",
               "compaction_trigger", "file_search_call", *MCP_ITEMS)
UNREADABLE_PARTS = {"input_audio": "audio"}

PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Item(BaseModel):
    # Fields OpenAI's item shapes have are declared; anything else is a mistake worth a 400.
    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class _Message(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[StrictStr, list[dict[str, Any]]]
    phase: str | None = None


class _FunctionCall(_Item):
    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    namespace: str | None = None
    caller: dict[str, Any] | None = None


class _FunctionCallOutput(_Item):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: Union[StrictStr, list[dict[str, Any]]]
    name: str | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None


class _ItemReference(_Item):
    type: Literal["item_reference"] | None = "item_reference"
    id: StrictStr


class _Reasoning(_Item):
    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = []
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None


class _Compaction(_Item):
    type: Literal["compaction"]
    encrypted_content: StrictStr
    created_by: str | None = None


class _CompactionTrigger(_Item):
    type: Literal["compaction_trigger"]


class _McpListTools(_Item):
    type: Literal["mcp_list_tools"]
    server_label: StrictStr
    tools: list[dict[str, Any]]
    error: str | None = None


class _McpCall(_Item):
    type: Literal["mcp_call"]
    status: Literal["in_progress", "completed", "incomplete", "calling", "failed"] | None = None  # type: ignore[assignment]
    server_label: StrictStr
    name: StrictStr
    arguments: StrictStr
    output: str | None = None
    error: dict[str, Any] | str | None = None
    approval_request_id: str | None = None


class _FileSearchCall(_Item):
    type: Literal["file_search_call"]
    status: Literal["in_progress", "searching", "completed", "incomplete", "failed"] | None = None  # type: ignore[assignment]
    queries: list[StrictStr]
    results: list[dict[str, Any]] | None = None


class _McpApprovalRequest(_Item):
    type: Literal["mcp_approval_request"]
    server_label: StrictStr
    name: StrictStr
    arguments: StrictStr


class _McpApprovalResponse(_Item):
    type: Literal["mcp_approval_response"]
    approval_request_id: StrictStr
    approve: bool
    reason: str | None = None


_MODELS: dict[str, type[_Item]] = {"message": _Message, "function_call": _FunctionCall,
                                   "function_call_output": _FunctionCallOutput, "item_reference": _ItemReference,
                                   "reasoning": _Reasoning, "compaction": _Compaction,
                                   "compaction_trigger": _CompactionTrigger, "mcp_list_tools": _McpListTools,
                                   "mcp_call": _McpCall, "file_search_call": _FileSearchCall,
                                   "mcp_approval_request": _McpApprovalRequest,
                                   "mcp_approval_response": _McpApprovalResponse}

# Finds a stored item by id for an item_reference (None: there is none the caller may see).
Resolver = Callable[[str], "Item | None"]


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _kind(raw: Any, where: str) -> str:
    if not isinstance(raw, dict):
        raise _bad(where, f"{where} must be an object (an input item).")
    kind = raw.get("type")
    if kind is not None and not isinstance(kind, str):
        raise _bad(f"{where}.type", f"{where}.type must be a string, one of: {', '.join(KNOWN_ITEMS)}.")
    if kind is None:
        # OpenAI's shorthands: a message may leave out its type, and so may a reference.
        kind = "message" if "role" in raw else "item_reference" if set(raw) == {"id"} else None
    if kind in KNOWN_ITEMS:
        return kind
    if kind in HOSTED_ITEMS:
        raise _bad(f"{where}.type", f"{where} is a '{kind}' item, which belongs to one of OpenAI's hosted tools; this "
                                    "server does not run them. Send messages, function_call and function_call_output "
                                    "items.")
    if kind is None:
        raise _bad(f"{where}.type", f"{where} has no type; give it one of: {', '.join(KNOWN_ITEMS)}.")
    raise _bad(f"{where}.type", f"Invalid value for '{where}.type': {kind!r}. Supported item types: "
                                f"{', '.join(KNOWN_ITEMS)}.")


def _validate(model: type[_Item], raw: dict[str, Any], loc: tuple[Any, ...]) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        errors: list[dict[str, Any]] = [{**err, "loc": ("body", *loc, *err["loc"])} for err in e.errors()]
        first = errors[0]
        if first["type"] == "extra_forbidden":
            name = _path(first["loc"][1:])
            raise InvalidRequestError(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter") from None
        raise from_validation_errors(errors) from None


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


# How image parts are read: whether the loaded model has vision (None: not asked, the items are
# only stored), and whether it runs in the web UI (for the advice of the 400 when it has none).
Vision = tuple["bool | None", bool]


def _text_part(part: Any, where: str, role: str, vision: Vision = (None, False)) -> ContentPart:
    """One content part, in its stored shape."""
    kind = part.get("type") if isinstance(part, dict) else None
    assistant = role == "assistant"
    if kind == "input_image" and not assistant:
        return images.part(part, where, vision=vision[0], web_ui=vision[1])
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        if kind == "output_text" and not assistant:
            raise _bad(f"{where}.type", f"{where} is an output_text part in a {role} message; only assistant "
                                        "messages hold output_text. Use input_text.")
        if assistant:
            return {"type": "output_text", "text": part["text"], "annotations": list(part.get("annotations") or []),
                    "logprobs": list(part.get("logprobs") or [])}
        return {"type": "input_text", "text": part["text"]}
    if kind == "refusal" and assistant and isinstance(part.get("refusal"), str):
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "input_file":   # (a response's input has them read first: input_files.py)
        raise _bad(f"{where}.type", f"{where} is an input_file part, which is read where a response is made "
                                    "(POST /v1/responses); here send the file's text as an input_text part.")
    if kind in UNREADABLE_PARTS:
        raise _bad(f"{where}.type", f"{where} is of type '{kind}', but the loaded text model cannot read "
                                    f"{UNREADABLE_PARTS[kind]}. Send input_text parts only.")
    if kind in ("input_text", "output_text", "refusal"):
        field = "refusal" if kind == "refusal" else "text"
        if kind == "refusal":
            raise _bad(f"{where}.type", f"{where} is a refusal part in a {role} message; only assistant messages "
                                        "hold refusals.")
        raise _bad(f"{where}.{field}", f"{where}.{field} must be a string.")
    allowed = "input_text, output_text or refusal" if assistant else "input_text or input_image"
    raise _bad(f"{where}.type", f"Invalid content part type {kind!r} at {where}; send {allowed}.")


def _message(m: _Message, where: str, vision: Vision) -> MessageItem:
    if isinstance(m.content, str):
        raw_parts: list[Any] = [{"type": "output_text" if m.role == "assistant" else "input_text", "text": m.content}]
    else:
        raw_parts = m.content
    parts = [_text_part(p, f"{where}.content[{j}]", m.role, vision) for j, p in enumerate(raw_parts)]
    return MessageItem(id=m.id or new_id("msg"), type="message", role=m.role, status=m.status or "completed",
                       content=parts)


def _output_value(out: Union[str, list[dict[str, Any]]], where: str,
                  vision: Vision) -> Union[str, list[ContentPart]]:
    if isinstance(out, str):
        return out
    return [_text_part(p, f"{where}.output[{j}]", "tool", vision) for j, p in enumerate(out)]


def parse(raw: Union[str, list[Any], None], *, where: str = "input", resolve: Resolver | None = None,
          vision: Vision = (None, False)) -> Items:
    """The request's items in their stored shape, ids given where the client sent none. ``vision``:
    whether the model they are shown to reads images (a 400 naming the part when it does not)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [MessageItem(id=new_id("msg"), type="message", role="user", status="completed",
                            content=[{"type": "input_text", "text": raw}])]
    return _items(raw, (where,), resolve, vision, compacted.Budget())


# The items a compaction keeps word for word: what compaction.split keeps.
KEPT_ITEMS = ("message", "function_call", "function_call_output", "reasoning", *MCP_ITEMS)


def _items(raw: list[Any], loc: tuple[Any, ...], resolve: Resolver | None, vision: Vision,
           budget: compacted.Budget) -> Items:
    """``raw``'s items, at ``loc`` in the request (an input, or the items a compaction keeps)."""
    out: Items = []
    for i, item in enumerate(raw):
        here = _path((*loc, i))
        kind = _kind(item, here)
        parsed = _validate(_MODELS[kind], item, (*loc, i))
        # (a function's namespace, and an output's function name, are kept when sent: a namespaced
        # call is shown to the model under its namespace's name for it, tools.py)
        if kind == "message":
            out.append(_message(parsed, here, vision))
        elif kind == "function_call":
            out.append(_function_call(parsed))
        elif kind == "function_call_output":
            out.append(_function_call_output(parsed, here, vision))
        elif kind == "reasoning":
            thought = ReasoningItem(id=parsed.id or new_id("rs"), type="reasoning", summary=parsed.summary)
            if parsed.content is not None:
                thought["content"] = parsed.content
            if parsed.encrypted_content is not None:
                thought["encrypted_content"] = parsed.encrypted_content
            out.append(thought)
        elif kind == "compaction":
            content = _compaction(parsed.encrypted_content, (*loc, i, "encrypted_content"), vision, budget)
            out.append(CompactionItem(id=parsed.id or new_id("cmp"), type="compaction", encrypted_content=content))
        elif kind in MCP_ITEMS:
            entry = parsed.model_dump()
            entry["id"] = parsed.id or new_id({"mcp_list_tools": "mcpl", "mcp_call": "mcp",
                                               "mcp_approval_request": "mcpr", "mcp_approval_response": "mcpa"}[kind])
            status = entry.pop("status")
            if kind == "mcp_call":
                entry["status"] = status or "completed"
            out.append(cast(Item, entry))   # the shape of its model, _MODELS[kind]
        elif kind == "file_search_call":
            entry = parsed.model_dump()
            entry.update(id=parsed.id or new_id("fs"), status=parsed.status or "completed")
            out.append(cast(FileSearchCallItem, entry))
        elif kind == "compaction_trigger":
            if i != len(raw) - 1:
                raise _bad(f"{here}.type", f"{here} is a compaction_trigger, which must be the last input item.")
            out.append(CompactionTriggerItem(type="compaction_trigger"))
        else:
            found = resolve(parsed.id) if resolve is not None else None
            if found is None:
                raise NotFoundError(f"Item with id '{parsed.id}' not found.", param=f"{here}.id")
            if vision[0] is False and images.held(found):
                raise no_vision(here, vision[1], what=f"refers to item '{parsed.id}', which holds an image",
                                param=f"{here}.id")
            out.append(found)
    return out


def _function_call(parsed: _FunctionCall) -> FunctionCallItem:
    call = FunctionCallItem(id=parsed.id or new_id("fc"), type="function_call", call_id=parsed.call_id,
                            name=parsed.name, arguments=parsed.arguments, status=parsed.status or "completed")
    if parsed.namespace is not None:
        call["namespace"] = parsed.namespace
    return call


def _function_call_output(parsed: _FunctionCallOutput, where: str, vision: Vision) -> FunctionCallOutputItem:
    answer = FunctionCallOutputItem(id=parsed.id or new_id("fco"), type="function_call_output",
                                    call_id=parsed.call_id, output=_output_value(parsed.output, where, vision),
                                    status=parsed.status or "completed")
    if parsed.name is not None:
        answer["name"] = parsed.name
    if parsed.namespace is not None:
        answer["namespace"] = parsed.namespace
    return answer


def _compaction(content: str, loc: tuple[Any, ...], vision: Vision, budget: compacted.Budget) -> str:
    """A compaction item's content, checked. It is not signed, so what it keeps is read as input
    items are, with the same checks and messages, each naming the kept item (e.g.
    ``input[3].encrypted_content[0].role``). Returned in the stored shape of its items (made again
    only when a kept item was not in it already), so that what it expands into is that shape."""
    inner = _path(loc)
    summary, kept = compacted.decode(content, inner, budget)
    for j, item in enumerate(kept):
        kind = _kind(item, f"{inner}[{j}]")
        if kind not in KEPT_ITEMS:
            raise _bad(f"{inner}[{j}].type", f"{inner}[{j}] is a '{kind}' item, which a compaction made by this "
                                             f"server never keeps (it keeps {', '.join(KEPT_ITEMS)} items).")
    stored = _items(kept, loc, None, vision, budget)
    answers.check_call_outputs([], stored, where=inner)
    return content if stored == kept else compacted.encode(summary, stored)


def text_of(item: Item) -> str:
    """A message's (or a function output's) text: its parts joined as chat joins text parts (an
    image as ``[image]``)."""
    if item["type"] == "message":
        content: str | list[ContentPart] | None = item["content"]
    elif item["type"] == "function_call_output":
        content = item["output"]
    elif item["type"] == "mcp_call":
        content = item.get("output")
    else:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join("[image]" if p.get("type") == "input_image" else str(p.get("text", p.get("refusal", "")))
                     for p in content or [])


def page(items: Sequence[Item], *, after: str | None, limit: int, order: str) -> dict[str, Any]:
    """OpenAI's cursor pagination over a list of items (oldest first): ``after`` is the id of the
    last item of the previous page, in the order asked for."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [it.get("id") for it in ordered]
        if after not in ids:
            raise _bad("after", f"No item with id '{after}' in this list; pass the last_id of the previous page.")
        start = ids.index(after) + 1
    data = ordered[start:start + limit]
    return cursor_page(data, start + limit < len(ordered))
