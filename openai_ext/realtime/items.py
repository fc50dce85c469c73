"""A session's conversation: its items in order (OpenAI's ``RealtimeConversationItem`` shapes),
the items a client may add, and the chat messages the text model is given for them.

A user's spoken turn is a message whose ``input_audio`` part carries the transcript once Whisper
has it; the model is given that transcript. An ``input_image`` part (a data URL) reaches a model
with vision as chat's image parts do. Function calls and their outputs become the chat
API's assistant ``tool_calls`` and ``tool`` messages, so tools work as they do for chat.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .events import ClientEventError, new_id

MAX_ITEMS = 1024
MAX_TEXT = 100_000
MAX_TOTAL_TEXT = 2_000_000      # characters a conversation holds; the oldest items give way beyond
ROLES = {"system": ("input_text",), "user": ("input_text", "input_audio", "input_image"),
         "assistant": ("output_text", "output_audio")}


class Conversation:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def find(self, item_id: str) -> dict[str, Any] | None:
        return next((i for i in self.items if i["id"] == item_id), None)

    def index(self, item_id: str) -> int:
        return next((k for k, i in enumerate(self.items) if i["id"] == item_id), -1)

    def last_id(self) -> str | None:
        return self.items[-1]["id"] if self.items else None

    def add(self, item: dict[str, Any], previous_item_id: str | None = None) -> str | None:
        """Adds ``item`` after ``previous_item_id`` (the end when None; "root": the start) and
        returns the id of the item before it."""
        # the oldest turns give way, as a long conversation's context would leave them out anyway
        while self.items and (len(self.items) >= MAX_ITEMS or
                              sum(map(_size, self.items)) + _size(item) > MAX_TOTAL_TEXT):
            del self.items[0]
        if previous_item_id is None:
            before = self.last_id()
            self.items.append(item)
            return before
        if previous_item_id == "root":
            self.items.insert(0, item)
            return None
        at = self.index(previous_item_id)
        if at < 0:
            raise ClientEventError(f"previous_item_id {previous_item_id!r} is not an item of this conversation.",
                                   param="previous_item_id", code="item_not_found")
        self.items.insert(at + 1, item)
        return previous_item_id

    def delete(self, item_id: str) -> bool:
        at = self.index(item_id)
        if at < 0:
            return False
        del self.items[at]
        return True


def _size(item: dict[str, Any]) -> int:
    return len(item.get("arguments") or "") + len(item.get("output") or "") + sum(
        len(p.get("text") or "") + len(p.get("transcript") or "") + len(p.get("image_url") or "")
        for p in item.get("content", ()))


def public(item: dict[str, Any]) -> dict[str, Any]:
    """An item as events carry it: audio bytes are never sent back."""
    out = copy.deepcopy(item)
    for part in out.get("content", ()):
        part.pop("audio", None)
    return out


def client_item(raw: Any) -> dict[str, Any]:
    """An item from ``conversation.item.create``, checked, with an id and status."""
    if not isinstance(raw, dict):
        raise ClientEventError("'item' must be an object, such as {\"type\": \"message\", \"role\": \"user\", "
                               "\"content\": [{\"type\": \"input_text\", \"text\": \"Hello\"}]}.", param="item")
    kind = raw.get("type")
    item_id = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else new_id("item")
    base = {"id": item_id, "object": "realtime.item", "status": "completed"}
    if kind == "message":
        role = raw.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise ClientEventError(f"'item.role' must be one of {', '.join(ROLES)}.", param="item.role")
        content = raw.get("content")
        if not isinstance(content, list) or not content:
            raise ClientEventError("'item.content' must be a non-empty list of content parts.", param="item.content")
        parts = []
        for k, part in enumerate(content):
            where = f"item.content[{k}]"
            if not isinstance(part, dict) or part.get("type") not in ROLES[role]:
                raise ClientEventError(f"'{where}.type' must be one of {', '.join(ROLES[role])} in a {role} message.",
                                       param=f"{where}.type")
            kept = {key: part[key] for key in ("type", "text", "transcript", "audio", "image_url", "detail")
                    if isinstance(part.get(key), str)}
            if len(kept.get("text", "") + kept.get("transcript", "")) > MAX_TEXT:
                raise ClientEventError(f"'{where}' is over {MAX_TEXT} characters.", param=where)
            if part["type"] == "input_audio" and "transcript" not in kept and "audio" not in kept:
                raise ClientEventError(f"'{where}': an input_audio part needs its 'audio' (base64, in the session's "
                                       "input format) or its 'transcript'.", param=f"{where}.audio")
            if part["type"] != "input_audio" or "transcript" in kept:
                kept.pop("audio", None)     # audio with a transcript is not heard again
            if part["type"] == "input_image" and "image_url" not in kept:
                raise ClientEventError(f"'{where}.image_url' is required: the image as a data URL "
                                       "(data:image/png;base64,...).", param=f"{where}.image_url",
                                       code="missing_required_parameter")
            if part["type"] in ("input_text", "output_text") and "text" not in kept:
                raise ClientEventError(f"'{where}.text' is required.", param=f"{where}.text",
                                       code="missing_required_parameter")
            parts.append(kept)
        return {**base, "type": "message", "role": role, "content": parts}
    if kind == "function_call":
        for key in ("name", "arguments"):
            if not isinstance(raw.get(key), str):
                raise ClientEventError(f"'item.{key}' is required (a string).", param=f"item.{key}",
                                       code="missing_required_parameter")
        call_id = raw.get("call_id") if isinstance(raw.get("call_id"), str) else new_id("call")
        return {**base, "type": "function_call", "call_id": call_id, "name": raw["name"],
                "arguments": raw["arguments"]}
    if kind == "function_call_output":
        if not isinstance(raw.get("call_id"), str) or not isinstance(raw.get("output"), str):
            raise ClientEventError("A function_call_output item needs 'call_id' (the call's) and 'output' (a string).",
                                   param="item.call_id" if not isinstance(raw.get("call_id"), str) else "item.output",
                                   code="missing_required_parameter")
        if len(raw["output"]) > MAX_TEXT:
            raise ClientEventError(f"'item.output' is over {MAX_TEXT} characters.", param="item.output")
        return {**base, "type": "function_call_output", "call_id": raw["call_id"], "output": raw["output"]}
    raise ClientEventError(f"'item.type' must be message, function_call or function_call_output, not {kind!r}.",
                           param="item.type")


def _text(item: dict[str, Any]) -> str:
    return " ".join(p.get("text") or p.get("transcript") or "" for p in item.get("content", ())).strip()


def chat_messages(items: list[dict[str, Any]], instructions: str) -> list[dict[str, Any]]:
    """The conversation as chat messages, after the instructions."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        kind = item["type"]
        if kind == "message":
            text = _text(item)
            images = [{"type": "image_url", "image_url": {"url": p["image_url"]}}
                      for p in item.get("content", ()) if p.get("type") == "input_image"]
            if images:   # read by a model with vision (text/images.py), refused by name otherwise
                messages.append({"role": item["role"], "content": [*images, {"type": "text", "text": text}]})
            elif text or item["role"] == "assistant":
                messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            elif last and last["role"] == "assistant" and not last.get("content"):
                last["tool_calls"] = [call]
                last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return [m for m in messages if m["role"] != "assistant" or m.get("content") or m.get("tool_calls")] \
        or [{"role": "user", "content": ""}]


def chat_tools(tools: list[dict[str, Any]], tool_choice: Any) -> tuple[list[dict[str, Any]] | None, Any]:
    """Realtime function tools and tool_choice in the chat API's shape."""
    if not tools:
        return None, None
    chat = [{"type": "function", "function": {k: v for k, v in (("name", t["name"]),
                                                                 ("description", t.get("description")),
                                                                 ("parameters", t.get("parameters")))
                                              if v is not None}} for t in tools]
    if isinstance(tool_choice, dict):
        return chat, {"type": "function", "function": {"name": tool_choice["name"]}}
    return chat, tool_choice


def arguments_json(arguments: str) -> str:
    """Arguments as compact JSON when they parse (the model's spacing otherwise)."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        return arguments
