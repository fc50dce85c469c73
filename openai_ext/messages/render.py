"""Anthropic's response objects: the Message, its usage and stop reason, its content blocks.

Every key Anthropic sends is written here, in one place per object. Usage is exact: the prompt's
tokens as the model's tokenizer counts them, and the tokens generated. The cache fields are
present as Anthropic sends them, at 0: nothing is billed from a cache here, so input_tokens is
the whole prompt.
"""

from __future__ import annotations

import json
import uuid
from typing import Any


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(call_id: str) -> str:
    """The id of a tool_use block, from the id the tool-call parser gave the call."""
    return "toolu_" + call_id.removeprefix("call_")


def mcp_tool_use_id(call_id: str) -> str:
    """The id of an mcp_tool_use block (the MCP connector's call), as Anthropic's begin."""
    return "mcptoolu_" + call_id.removeprefix("call_")


def mcp_tool_result(tool_use_id: str, text: str, is_error: bool) -> dict[str, Any]:
    return {"type": "mcp_tool_result", "tool_use_id": tool_use_id, "is_error": is_error,
            "content": [{"type": "text", "text": text}]}


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "service_tier": "standard"}


def delta_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """message_delta's usage: cumulative counts, as Anthropic sends them at the end of a stream."""
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def stop_reason(finish: str, stop: str | None, *, stops: list[str], called: bool,
                clamped: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a generation that ended with chat's ``finish`` reason.

    ``stop``: the stop string that ended it (the request's, or one its chat template implies);
    ``called``: it made tool calls; ``clamped``: the context left less room than max_tokens.
    Cut short is max_tokens even after complete calls, as chat reports length: the client must
    know the answer is unfinished."""
    if finish == "length":
        return ("model_context_window_exceeded" if clamped else "max_tokens"), None
    if called:
        return "tool_use", None
    if stop is not None and stop in stops:
        return "stop_sequence", stop
    return "end_turn", None


def message(msg_id: str, model: str, content: list[dict[str, Any]], reason: str | None, sequence: str | None,
            usage_: dict[str, Any], context_management: dict[str, Any] | None = None) -> dict[str, Any]:
    """``context_management``: what the request's context edits did, sent only to a request that
    asked for editing (a beta field, unknown to clients of the plain Message)."""
    out = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": reason, "stop_sequence": sequence, "usage": usage_}
    if context_management is not None:
        out["context_management"] = context_management
    return out


def fold(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks that a sequence of content_block_* events builds, as a client
    accumulates them: a whole answer is rendered from the very events a stream would send."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for ev in events:
        kind = ev["type"]
        if kind == "content_block_start":
            blocks.append(dict(ev["content_block"]))
        elif kind == "content_block_delta":
            delta, block = ev["delta"], blocks[ev["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                partial[ev["index"]] = partial.get(ev["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and ev["index"] in partial:
            # a block is sent only for a whole call (stream.Blocks), whose input is whole JSON; one
            # the grammar let through malformed (never seen) keeps the input it started with
            try:
                blocks[ev["index"]]["input"] = json.loads(partial.pop(ev["index"]) or "{}")
            except json.JSONDecodeError:
                pass
    return blocks
