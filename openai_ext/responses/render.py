"""The Response object and its output items, shaped as OpenAI's spec has them.

``ResponseState`` is one response on its way: the request's echoed fields (fixed when it is
prepared), its status, and its output items as they grow. ``snapshot()`` is the Response object at
any moment: in stream events, in the store, and as the body of a non-streamed answer.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import OpenAIError
from ..hosts.base import TokenLogprob
from . import tools
from .item_types import ContentPart, FunctionCallItem, Items, Logprob, MessageItem, OutputTextPart, Status
from .protocol import CreateResponse

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Exact counts from the model's tokenizer. Nothing is reported as cached (the embedded host
    does reuse the previous prompt's prefix, but cannot say how much) and no model here reasons
    apart from its answer."""
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def output_logprobs(entries: list[TokenLogprob]) -> list[Logprob]:
    """Log-probabilities on an output_text part and on its text deltas (with bytes: Open Responses requires them
    on deltas too, and OpenAI's spec lets them through)."""
    return [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes or list(e.token.encode()),
             "top_logprobs": [{"token": t, "logprob": lp, "bytes": b or list(t.encode())} for t, lp, b in e.top]}
            for e in entries]


def error_object(error: OpenAIError) -> dict[str, Any]:
    """An error as Open Responses' stream and WebSocket error events carry it: its code always set (the type
    stands in where the error has none of its own)."""
    return {"type": error.type, "code": error.code or error.type, "message": error.message, "param": error.param}


def error_fields(error: OpenAIError) -> dict[str, Any]:
    """The fields of an ``error`` stream event: OpenAI's (code, message and param at the top) and Open Responses'
    (the same in an ``error`` object, with the type); each spec lets the other's through."""
    inner = error_object(error)
    return {"code": inner["code"], "message": error.message, "param": error.param, "error": inner}


def text_part(text: str = "", logprobs: list[Logprob] | None = None) -> OutputTextPart:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(item_id: str, status: Status, parts: list[ContentPart]) -> MessageItem:
    return MessageItem(id=item_id, type="message", status=status, role="assistant", content=parts)


def call_item(item_id: str, status: Status, call_id: str, name: str, arguments: str,
              namespace: str | None = None) -> FunctionCallItem:
    item = FunctionCallItem(id=item_id, type="function_call", status=status, call_id=call_id, name=name,
                            arguments=arguments)
    if namespace is not None:
        item["namespace"] = namespace
    return item


def format_echo(fmt: dict[str, Any] | None) -> dict[str, Any]:
    """text.format as the Response object repeats it: a json_schema format with its description and strict, which
    Open Responses requires; when they were not sent, "" (OpenAI's spec takes no null there) and false."""
    if not fmt:
        return {"type": "text"}
    if fmt.get("type") == "json_schema":
        return {"description": "", "strict": False, **fmt}
    return fmt


def echo(body: CreateResponse, *, store: bool, conversation_id: str | None) -> dict[str, Any]:
    """The request's fields every Response object repeats, with OpenAI's defaults filled in."""
    reasoning = body.reasoning
    text = body.text
    out: dict[str, Any] = {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "prompt_cache_key": body.prompt_cache_key,
        "reasoning": {"effort": reasoning.effort if reasoning else None,
                      "summary": reasoning.summary if reasoning else None},
        "safety_identifier": body.safety_identifier,
        "service_tier": "default",
        "store": store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": format_echo(text.format if text else None),
                 "verbosity": (text.verbosity if text else None) or "medium"},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": tools.echo(body.tools),
        "top_logprobs": body.top_logprobs or 0,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "presence_penalty": body.presence_penalty or 0.0,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "truncation": body.truncation or "disabled",
        "conversation": {"id": conversation_id} if conversation_id else None,
    }
    if body.user is not None:
        out["user"] = body.user
    return out


@dataclass
class ResponseState:
    id: str
    model: str
    echo: dict[str, Any]
    background: bool = False
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "in_progress"
    output: Items = field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    incomplete_reason: str | None = None
    completed_at: int | None = None
    search_results: bool = True   # file_search_call results shown (include: file_search_call.results)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def finish(self, status: str, *, reason: str | None = None, error: dict[str, Any] | None = None) -> None:
        self.status = status
        self.incomplete_reason = reason
        self.error = error
        if status == "completed":
            self.completed_at = int(time.time())

    def _shown(self) -> Items:
        """The output as the client sees it (file_search_call results only when included)."""
        if self.search_results:
            return self.output
        return [{**it, "results": None} if it["type"] == "file_search_call" else it for it in self.output]

    def snapshot(self) -> dict[str, Any]:
        body = {"id": self.id, "object": "response", "created_at": self.created_at, "status": self.status,
                "background": self.background, "completed_at": self.completed_at, "error": self.error,
                "incomplete_details": {"reason": self.incomplete_reason} if self.incomplete_reason else None,
                "model": self.model, "output": copy.deepcopy(self._shown()), **copy.deepcopy(self.echo),
                # null until the end: Open Responses requires the key in every snapshot
                "usage": dict(self.usage) if self.usage is not None else None}
        return body


# Fields the Response object gained after earlier releases stored theirs (Open Responses requires
# them): a body read back from the store is given their defaults, so it is as valid as a new one.
GAINED: dict[str, Any] = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "usage": None}


def conform(body: dict[str, Any]) -> dict[str, Any]:
    for key, value in GAINED.items():
        body.setdefault(key, value)
    return body


def conform_event(event: dict[str, Any]) -> dict[str, Any]:
    if isinstance(event.get("response"), dict):
        conform(event["response"])
    return event


def output_text(response: dict[str, Any]) -> str:
    """The text of every output_text part, as the SDKs' output_text property joins it."""
    return "".join(part["text"] for item in response.get("output", []) if item.get("type") == "message"
                   for part in item.get("content", []) if part.get("type") == "output_text")
