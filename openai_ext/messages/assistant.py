"""An assistant turn of a Messages request, as chat messages.

A turn holds text, ``tool_use`` blocks (the client's tools: their results come in the next user
turn) and thinking (dropped: the chat templates have no place for earlier turns' thinking). A
turn the MCP connector wrote also holds rounds of ``mcp_tool_use`` blocks, each followed in the
same turn by its ``mcp_tool_result``: the model called those tools, and the server ran them,
before it wrote what follows. Each round becomes what the model was shown when it went on: an
assistant message with the text before and the calls, then a tool message per result. The text
after the last round, and the client's calls there, are the turn's own (a last turn's text is a
prefill the model continues, as without MCP).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import InvalidRequestError
from .offered import TOOL_CHANGES
from .protocol import (
    InputMessage,
    McpToolResultBlock,
    McpToolUseBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)

_IN_TURNS = ("tool_use", "tool_result", "thinking", "redacted_thinking", "mcp_tool_use", "mcp_tool_result")


def unreadable(block: Any, where: str) -> InvalidRequestError:
    """The 400 of a block this server does not take where it stands."""
    kind = block.type
    if kind in ("document", "search_result", "container_upload"):
        why = "which the loaded text model cannot read. Send text blocks only"
    elif kind == "image":
        why = "which belongs in a user turn (or a tool_result)"
    elif kind in (*_IN_TURNS, *TOOL_CHANGES):
        why = "which does not belong here"
    else:
        why = "which this server does not take (results of Anthropic's server tools are not run here)"
    return InvalidRequestError(f"{where} is a block of type '{kind}', {why}.", param=f"{where}.type")


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


@dataclass
class Assistant:
    rounds: list[dict[str, Any]] = field(default_factory=list)   # chat messages of its MCP rounds
    text: str = ""                                                # its text after the last round
    calls: list[dict[str, Any]] = field(default_factory=list)     # the client's calls after the last round
    client: list[str] = field(default_factory=list)               # the ids of all its tool_use blocks


def _result(b: McpToolResultBlock, where: str) -> str:
    """An mcp_tool_result's text; is_error is shown as chat's tool results show it (``Error: ...``)."""
    if isinstance(b.content, str) or b.content is None:
        text = b.content or ""
    else:
        texts = []
        for k, part in enumerate(b.content):
            if not isinstance(part, TextBlock):
                raise unreadable(part, f"{where}.content[{k}]")
            texts.append(part.text)
        text = "\n".join(texts)
    return f"Error: {text}" if b.is_error else text


def read(m: InputMessage, where: str) -> Assistant:
    """The turn ``m`` (sent as ``where``, its content's path)."""
    if isinstance(m.content, str):
        return Assistant(text=m.content)
    assert m.content is not None, "translate._check_message refuses a turn without content"
    out = Assistant()
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    pending: dict[str, int] = {}       # mcp_tool_use ids -> their blocks, until their results

    def close_round() -> None:
        out.rounds.append({"role": "assistant", "content": "\n".join(texts) or None, "tool_calls": list(calls)})
        out.rounds.extend(results)
        texts.clear()
        calls.clear()
        results.clear()

    for j, b in enumerate(m.content):
        if isinstance(b, (ThinkingBlock, RedactedThinkingBlock)):
            continue   # reasoning models' templates drop earlier turns' thinking too (Qwen3, gpt-oss)
        if results and not isinstance(b, McpToolResultBlock):
            close_round()
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolUseBlock):
            calls.append(_call(b.id, b.name, b.input))
            out.client.append(b.id)
        elif isinstance(b, McpToolUseBlock):
            calls.append(_call(b.id, b.name, b.input))
            pending[b.id] = j
        elif isinstance(b, McpToolResultBlock):
            if pending.pop(b.tool_use_id, None) is None:
                raise InvalidRequestError(
                    f"{where}[{j}] is an mcp_tool_result for '{b.tool_use_id}', which is not the id of an "
                    "mcp_tool_use block before it in this turn.", param=f"{where}[{j}].tool_use_id")
            results.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": _result(b, f"{where}[{j}]")})
        else:
            raise unreadable(b, f"{where}[{j}]")
    if pending:
        j = min(pending.values())
        raise InvalidRequestError(f"{where}[{j}] is an mcp_tool_use block without its mcp_tool_result in the same "
                                  "turn; send the turn back as the response gave it.", param=f"{where}[{j}]")
    if results:
        close_round()
    out.text, out.calls = "\n".join(texts), calls
    return out
