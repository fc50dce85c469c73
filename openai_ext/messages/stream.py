"""Anthropic's event stream: content blocks as they are generated, and their SSE framing.

``Blocks`` turns the generated text, split by the tool-call parser into content and calls,
into ``content_block_start`` / ``content_block_delta`` / ``content_block_stop`` events: text
as ``text_delta``, each call as a ``tool_use`` block whose input arrives as ``input_json_delta``
fragments, as they were generated (when a grammar guarantees the calls; otherwise in pieces of
the validated call), once the call is complete: a call that max_tokens cuts short is never sent
as a block (the stop reason, max_tokens, says the answer was cut). A whole, non-streamed answer
is folded from the same events, so both give the same content. A call of an MCP server's tool
(the MCP connector) is an ``mcp_tool_use`` block, streamed as a ``tool_use`` is; its
``mcp_tool_result`` comes whole in its ``content_block_start`` (``result``), as Anthropic
streams server tools' results. An answer written in several passes (calls run between them)
numbers its blocks on from pass to pass (``index``).

``AnthropicFraming`` writes each event as ``event: <type>`` and ``data: {json}``, an error after
the stream began as ``event: error``, no ``[DONE]``, and keep-alive pings as real
``event: ping`` events, which Anthropic's clients expect (OpenAI's are SSE comments).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..core.errors import OpenAIError, internal_error
from ..core.streaming import PING_SECONDS, Framing, dumps
from ..text import tools
from ..text.output import OutputParser, Thinking
from . import errors, render

# Seconds between keep-alive pings while a stream waits (for its turn, or for a slow token).
PING_INTERVAL: float = PING_SECONDS

PING = {"type": "ping"}


class Blocks:
    """One generation's content blocks, as stream events. ``mcp``: the name of each MCP tool's
    server (its calls are mcp_tool_use blocks); ``index``: the index of the block before the
    first (-1: none; an earlier pass's last)."""

    def __init__(self, output: OutputParser, *, mcp: Mapping[str, str] | None = None, index: int = -1):
        # the one parser's events: a reasoning model's thinking (a thinking block first), text, calls
        self.output = output
        self.mcp = mcp or {}
        self.index = index
        self.open: str | None = None     # the type of the block now open
        # The events of the call being generated, held until it is complete: a tool_use block is
        # sent only for a whole call, streamed or not.
        self.held: list[tools.CallDelta] = []

    @property
    def called(self) -> bool:
        return self.output.called

    def made(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The whole calls of the generation (a call max_tokens cut is none), OpenAI-shaped:
        (those of MCP tools, the client's)."""
        calls = [c for k, c in enumerate(self.output.calls) if k not in self.output.cut]
        mine = [c for c in calls if c["function"]["name"] in self.mcp]
        return mine, [c for c in calls if c["function"]["name"] not in self.mcp]

    def result(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        """A block sent whole (an mcp_tool_result): its start, with its content, and its stop."""
        return self._start(block) + self.close()

    def feed(self, text: str, *, final: bool = False) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for part in self.output.feed(text, final=final):
            if isinstance(part, tools.CallDelta):
                if self.held and self.held[0].index != part.index:
                    out += self.release()     # the call before it is complete
                self.held.append(part)
                continue
            if self.held and not (isinstance(part, tools.Content) and not part.text):
                out += self.release()         # anything after a call comes once it is complete
            if isinstance(part, Thinking):
                if self.open != "thinking":
                    out += self._start({"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": part.text}))
            elif isinstance(part, tools.Content):
                if not part.text:
                    continue
                if self.open != "text":
                    out += self._start({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": part.text}))
        if self.held and (final or self.held[0].index < len(self.output.calls)):
            out += self.release()
        if final:
            out += self.close()
        return out

    def release(self) -> list[dict[str, Any]]:
        """The held call as a tool_use block, its input in the fragments it was generated in; or
        nothing, for a call max_tokens cut short: it is no call, and stop_reason max_tokens says
        the answer was cut (Anthropic's SDK never runs the calls of such a turn)."""
        held, self.held = self.held, []
        if not held or held[0].index in self.output.cut:
            return []
        out: list[dict[str, Any]] = []
        for part in held:
            server = self.mcp.get(part.name or "")
            if part.id is not None and server is not None:
                out += self._start({"type": "mcp_tool_use", "id": render.mcp_tool_use_id(part.id),
                                    "name": part.name, "server_name": server, "input": {}})
            elif part.id is not None:
                out += self._start({"type": "tool_use", "id": render.tool_use_id(part.id), "name": part.name,
                                    "input": {}})
            if part.arguments:
                out.append(self._delta({"type": "input_json_delta", "partial_json": part.arguments}))
        return out

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        return out + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}


def event(obj: dict[str, Any]) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + dumps(obj) + b"\n\n"


class AnthropicFraming(Framing):
    """The framing of core.streaming.event_stream for Anthropic's streams: named events, and
    Anthropic's own ping event."""

    @property
    def ping_seconds(self) -> float:
        return PING_INTERVAL

    def frame(self, chunk: dict[str, Any]) -> bytes:
        return event(chunk)

    def error(self, error: OpenAIError | None, exc: BaseException) -> bytes:
        return event(errors.body(error if error is not None else internal_error(exc)))

    def end(self) -> bytes:
        return b""

    def keepalive(self) -> Callable[[], bytes]:
        return lambda: event(PING)
