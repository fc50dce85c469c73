"""A Messages request as the text family's chat request.

The Messages API is served by the chat machinery as it is: the request is rewritten into a
``ChatCompletionRequest``, and ``chat.prepare`` renders it with the model's chat template,
``params.plan`` maps it onto host settings, and the tools and grammar modules build and check
the calls. What has no chat counterpart is mapped here, by the rules in ``RULES`` (the README's
table is generated from it); nothing here talks to the host.

History: a user turn's ``tool_result`` blocks become ``tool`` messages (the results of the
previous assistant turn's ``tool_use`` blocks, which become its tool calls; an assistant turn's
``mcp_tool_use`` and ``mcp_tool_result`` blocks become calls and results too: assistant.py); text blocks are
joined with a newline, as chat joins text parts. A system message stays a system message where
it stands (chat keeps later system messages in place); its tool changes are read by offered.py. ``thinking`` blocks are dropped: the chat
templates the server renders through have no place for them. A conversation that ends with an
assistant turn is a prefill: the model continues that text, as at Anthropic.

Images: a user turn's ``image`` blocks (and those of a ``tool_result``) become chat ``image_url``
parts, a base64 source as a data URL, so they reach a vision model loaded in the web UI as chat's
do. ``Translation.names`` keeps where each one was sent, for ``chat_error`` to name the block
(``messages[i].content[j]``) rather than its place in the chat request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..core import rules
from ..core.errors import InvalidRequestError, PathNames, from_validation_errors, renamed
from ..core.rules import Rule
from ..text.protocol import ChatCompletionRequest
from . import assistant, images
from .assistant import unreadable as _unreadable
from .images import Part
from .images import image as _image
from .images import parts_content as _content
from .offered import TOOL_CHANGES, chat_tools
from .protocol import (
    CountTokensRequest,
    InputMessage,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

M = "messages"

RULES: tuple[Rule, ...] = (
    Rule("model", M, "server", "model", "Any name is served by the loaded model; the response reports the loaded model's id."),
    Rule("max_tokens", M, "mapped", "max_tokens", "Required, at least 1. Clamped to the room left in the context; a reply cut there (not at max_tokens) ends with stop_reason model_context_window_exceeded."),
    Rule("messages", M, "mapped", "messages", "Roles user, assistant and system (next row); content a string or blocks: text, image, tool_use, tool_result (string, or text and image blocks; is_error), thinking and redacted_thinking (dropped). A last assistant turn is a prefill the model continues. image blocks (a base64 source; png, jpeg, gif or webp) reach a vision model (loaded in the web UI, or standalone with its projector) as chat's image parts do; without one, and for url and file sources (the server fetches nothing), a 400 naming the block. document and other blocks get a 400."),
    Rule("messages (role system)", M, "mapped", "system messages in place", "Text (a string or text blocks) stays where it stands; clear_at next_user_message leaves it out once a later user turn exists. tool_addition and tool_removal blocks (tool_reference, or an inline tool_definition) change the tools offered to the model. output_config.effort is ignored; clear_at and output_config on other roles get a 400."),
    Rule("system", M, "mapped", "messages[0] (system)", "A string or text blocks, joined with newlines."),
    Rule("stop_sequences", M, "mapped", "stop", "Any number; the one that ended the reply is returned in stop_sequence (stop_reason stop_sequence)."),
    Rule("temperature", M, "mapped", "temperature", "0-1, default 1; 0 is greedy decoding."),
    Rule("top_p", M, "mapped", "top_p", "0-1."),
    Rule("top_k", M, "mapped", "top_k (host sampler)", "The host's own top_k sampler; 400 if the host has none."),
    Rule("stream", M, "mapped", "stream", "Anthropic's named events: message_start, content_block_start/delta/stop, message_delta, message_stop, and ping."),
    Rule("metadata", M, "mapped", "user", "metadata.user_id is accepted; nothing is stored."),
    Rule("tools", M, "mapped", "tools", "Custom tools (name, description, input_schema) become function tools. mcp_toolset entries choose the tools of mcp_servers (see mcp_servers). Anthropic's server tools (web search, code execution, bash, text editor ...) get a 400 naming them."),
    Rule("tool_choice", M, "mapped", "tool_choice, parallel_tool_calls", "auto -> auto; any -> required; tool -> the named function; none -> none. any and tool are enforced by a grammar, so input always validates against input_schema. disable_parallel_tool_use -> parallel_tool_calls false."),
    Rule("output_config", M, "mapped", "response_format", "format {type: json_schema, schema} -> response_format json_schema (grammar-enforced); effort is ignored."),
    Rule("thinking", M, "mapped", "enable_thinking", "Checked as Anthropic checks it (enabled needs budget_tokens >= 1024 and below max_tokens). enabled and adaptive turn the model's reasoning switch on, disabled off, where its chat template has one (extension mode); budget_tokens is not enforced. A reasoning model's thinking comes back as a thinking block before the answer (streamed as thinking_delta, signature empty); a model without a reasoning mode, such as the embedded SmolLM2, writes none."),
    Rule("context_management", M, "server", "-", "clear_tool_uses_20250919 is applied as Anthropic documents it (trigger, keep, clear_at_least, clear_tool_inputs, exclude_tools): old tool results are replaced by a note in what the model is shown, and the response reports context_management.applied_edits. clear_thinking_20251015 is done already (earlier thinking is never shown to the model). compact_20260112 gets a 400."),
    Rule("thread", M, "server", "-", "Threads are kept in memory: create keeps the conversation under the reply's id; continue sends only the new messages (without system and tools). An unknown or dropped id is thread_not_found (404), a reply continued twice thread_already_continued; Anthropic's SDK then replays the whole conversation."),
    Rule("cache_control", M, "ignored", "-", "On the request or on blocks. No cache is billed; the embedded host reuses the prompt prefix of the previous request by itself. cache_* usage fields are 0."),
    Rule("service_tier", M, "ignored", "-", "One local tier; usage.service_tier is standard."),
    Rule("inference_geo", M, "ignored", "-", "Local."),
    Rule("speed", M, "ignored", "-", "One speed."),
    Rule("diagnostics", M, "ignored", "-", "No prompt cache to diagnose."),
    Rule("user_profile_id, workspace_id", M, "ignored", "-", "One local user; nothing is stored."),
    Rule("container", M, "rejected", "-", "There is no code execution container: 400."),
    Rule("mcp_servers", M, "server", "tools (each server's)", "Anthropic's MCP connector, with the header anthropic-beta mcp-client-2025-11-20 (tools chosen by mcp_toolset entries in tools) or mcp-client-2025-04-04 (tool_configuration); without it, 400. Servers must be allowed by mcp_allow. Their tools are listed once per request and offered beside tools; the server runs the model's calls (mcp_timeout each, mcp_max_calls a response) and the answer goes on, with mcp_tool_use and mcp_tool_result blocks in its content. authorization_token is sent as Authorization: Bearer, never logged or kept."),
    Rule("host samplers", M, "mapped", "same name", "Extra fields named after the host's own samplers (min_p, repetition_penalty ...), as in chat."),
)


def _bad(message: str, param: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


@dataclass
class Translation:
    chat: ChatCompletionRequest
    prefill: str = ""                  # the text of a last assistant turn, continued by the model
    stops: list[str] = field(default_factory=list)   # the request's own stop_sequences
    max_tokens: int = 0
    # chat's name of an image part (messages[k].content[l]) -> the block it came from, and its source's field
    names: dict[str, tuple[str, str]] = field(default_factory=dict)
    tools: list[str] = field(default_factory=list)   # the path each chat tool was sent under


def to_chat(req: CountTokensRequest, *, mcp: list[Any] | None = None,
            later: bool = False) -> Translation:
    """The chat request that renders and samples as ``req`` asks (a MessagesRequest, or a
    CountTokensRequest, which only shapes the prompt). ``mcp``: the MCP servers' tools offered
    (connector.McpTool); ``later``: a pass after MCP calls (offered.chat_tools)."""
    _check_fields(req)
    names: dict[str, tuple[str, str]] = {}
    messages, prefill = _history(req, names)
    sampling = req if isinstance(req, MessagesRequest) else None   # a token count samples nothing
    if sampling is not None:
        _check_thinking(sampling)
    thinking = sampling.thinking if sampling is not None else None
    offered, paths = chat_tools(req, mcp, later=later)
    fmt = req.output_config.format if req.output_config is not None else None
    try:
        chat = ChatCompletionRequest(
            model=req.model, messages=messages,
            max_tokens=None if sampling is None else sampling.max_tokens,
            temperature=None if sampling is None else sampling.temperature,
            top_p=None if sampling is None else sampling.top_p,
            stream=None if sampling is None else sampling.stream,
            user=sampling.metadata.user_id if sampling is not None and sampling.metadata is not None else None,
            tools=offered.tools, tool_choice=offered.tool_choice, parallel_tool_calls=offered.parallel_tool_calls,
            response_format=None if fmt is None else {"type": "json_schema",
                                                      "json_schema": {"name": "output", "schema": fmt.schema_}},
            # host samplers (top_k is one: params.plan checks the host has it) and the web UI's own
            # fields mean here what they mean in chat; enable_thinking is the model's reasoning
            # switch, where its chat template has one (extension mode)
            **_host_fields(req, sampling, thinking))
    except ValidationError as e:   # ranges are checked on the Messages model already; a safety net
        raise from_validation_errors([dict(x) for x in e.errors()]) from None
    stops = list(req.stop_sequences or []) if isinstance(req, MessagesRequest) else []
    chat.stop = stops or None   # any number: chat's limit of 4 is OpenAI's, not Anthropic's
    if prefill and chat.tool_choice not in (None, "auto", "none"):
        raise _bad("A prefilled assistant turn cannot be combined with tool_choice any or tool; drop one of "
                   "them.", "tool_choice")
    return Translation(chat, prefill, stops, req.max_tokens if isinstance(req, MessagesRequest) else 0, names,
                       paths)


def _host_fields(req: CountTokensRequest, sampling: MessagesRequest | None, thinking: Any) -> dict[str, Any]:
    """The extra fields chat reads as host samplers and the web UI's fields."""
    out = {k: v for k, v in (req.model_extra or {}).items() if k in type(req).passes}
    if sampling is not None and sampling.top_k is not None:
        out["top_k"] = sampling.top_k
    if thinking is not None:
        out["enable_thinking"] = thinking.type != "disabled"
    return out


def _check_fields(req: CountTokensRequest) -> None:
    # (mcp_servers is read by connector.py, before the translation; unknown fields were refused
    # by the request model)
    if getattr(req, "container", None) is not None:
        raise _bad("There is no code execution container on this server; remove container.", "container")


def _check_thinking(req: MessagesRequest) -> None:
    t = req.thinking
    if t is None or t.type != "enabled":
        return
    if t.budget_tokens is None:
        raise _bad("thinking.budget_tokens is required when thinking is enabled.", "thinking.budget_tokens")
    if t.budget_tokens < 1024 or t.budget_tokens >= req.max_tokens:
        raise _bad("thinking.budget_tokens must be at least 1024 and less than max_tokens.", "thinking.budget_tokens")


def _text(blocks: list[Any], where: str) -> str:
    texts = []
    for j, b in enumerate(blocks):
        if not isinstance(b, TextBlock):
            raise _unreadable(b, f"{where}[{j}]")
        texts.append(b.text)
    return "\n".join(texts)


def _parts(blocks: list[Any], where: str) -> list[Part]:
    """A tool_result's blocks: text and images."""
    out: list[Part] = []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            out.append(({"type": "text", "text": b.text}, None))
        elif b.type == "image":
            out.append(_image(b, f"{where}[{j}]"))
        else:
            raise _unreadable(b, f"{where}[{j}]")
    return out


def _history(req: CountTokensRequest, names: dict[str, tuple[str, str]]) -> tuple[list[dict[str, Any]], str]:
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system",
                    "content": req.system if isinstance(req.system, str) else _text(req.system, "system")})
    prefill = ""
    calls: set[str] = set()     # ids of the previous assistant turn's tool_use blocks
    asked = -1                  # the index of that turn while the next turn must answer them
    last = len(req.messages) - 1
    last_user = max((i for i, m in enumerate(req.messages) if m.role == "user"), default=-1)
    if all(m.role == "system" for m in req.messages):
        raise _bad("messages holds system messages only; send at least one user turn.", "messages")
    for i, m in enumerate(req.messages):
        where = f"messages[{i}].content"
        _check_message(m, i)
        if m.role == "system":
            # in place, as chat keeps a later system message where it stands; one that asks to be
            # shown only until the next user turn is left out once that turn exists
            text = _system_text(m, where)
            if text and not (m.clear_at == "next_user_message" and i < last_user):
                out.append({"role": "system", "content": text})
        elif m.role == "assistant":
            turn = assistant.read(m, where)
            out.extend(turn.rounds)
            if i == last and not turn.client:
                prefill = turn.text
                continue
            if turn.client and i > last_user:
                raise _bad(f"messages[{i}] is an assistant turn with tool_use blocks; send their tool_result blocks "
                           "in a user turn after it.", f"messages[{i}]")
            _check_answered(req.messages, asked, i)
            asked = i if turn.client else -1
            calls = set(turn.client)
            if turn.text or turn.calls or not turn.rounds:
                out.append({"role": "assistant", "content": turn.text or (None if turn.calls else ""),
                            **({"tool_calls": turn.calls} if turn.calls else {})})
        else:
            out.extend(_user(m, where, calls, names, len(out)))   # a result for an unknown id first
            _check_answered(req.messages, asked, i)
            asked = -1
            calls = set()
    return out, prefill


def _check_answered(messages: list[InputMessage], asked: int, i: int) -> None:
    """The turn messages[i], which follows the assistant turn messages[asked] (-1: none, or one
    without tool_use blocks), holds a tool_result block for each of its tool_use blocks, as
    Anthropic requires."""
    if asked < 0:
        return
    content = messages[i].content
    answered = {b.tool_use_id for b in content if isinstance(b, ToolResultBlock)} if isinstance(content, list) else set()
    uses = messages[asked].content
    assert isinstance(uses, list), "an assistant turn with tool_use blocks holds blocks"
    missing = [b.id for b in uses if isinstance(b, ToolUseBlock) and b.id not in answered]
    if missing:
        raise _bad(f"messages[{asked}]: `tool_use` ids were found without `tool_result` blocks immediately after: "
                   f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in "
                   f"the next message: send messages[{i}] as a user turn that begins with a tool_result block for "
                   "each of them (the tool's output, or is_error with what went wrong).", f"messages[{i}].content")


def _check_message(m: InputMessage, i: int) -> None:
    if m.role != "system":
        for name in ("clear_at", "output_config"):
            if getattr(m, name) is not None:
                raise _bad(f"messages[{i}].{name} is only permitted on role 'system' messages.", f"messages[{i}].{name}")
        if m.content is None:
            raise _bad(f"messages[{i}].content is required.", f"messages[{i}].content")
        return
    if m.content is None and m.output_config is None:
        raise _bad(f"messages[{i}] is a system message with neither content nor output_config; send one of them.",
                   f"messages[{i}].content")
    if m.output_config is not None and "format" in (m.output_config.model_extra or {}):
        raise _bad(f"messages[{i}].output_config.format is not permitted: format is set by the top-level "
                   "output_config only.", f"messages[{i}].output_config.format")


def _system_text(m: InputMessage, where: str) -> str:
    """A system message's text; its tool_addition and tool_removal blocks are read by offered.py."""
    if m.content is None or isinstance(m.content, str):
        return m.content or ""
    texts = []
    for j, b in enumerate(m.content):
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif b.type not in TOOL_CHANGES:
            raise _bad(f"{where}[{j}] is a block of type '{b.type}'; a system message holds text, tool_addition "
                       "and tool_removal blocks.", f"{where}[{j}].type")
    return "\n".join(texts)


def _user(m: InputMessage, where: str, calls: set[str], names: dict[str, tuple[str, str]],
          base: int) -> list[dict[str, Any]]:
    """A user turn as chat messages (``base``: how many come before them in the chat request)."""
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}]
    assert m.content is not None, "_check_message refuses a turn without content"
    out: list[dict[str, Any]] = []
    parts: list[Part] = []

    def flush() -> None:
        if parts:
            out.append({"role": "user", "content": _content(parts, names, base + len(out))})
            parts.clear()

    for j, b in enumerate(m.content):
        if isinstance(b, TextBlock):
            parts.append(({"type": "text", "text": b.text}, None))
        elif b.type == "image":
            parts.append(_image(b, f"{where}[{j}]"))
        elif isinstance(b, ToolResultBlock):
            if b.tool_use_id not in calls:
                raise _bad(f"{where}[{j}] is a tool_result for '{b.tool_use_id}', which is not the id of a tool_use "
                           "block in the assistant turn just before it.", f"{where}[{j}].tool_use_id")
            flush()
            # is_error has no field in a chat tool message: the model reads it in the text
            if isinstance(b.content, str):
                result: Any = f"Error: {b.content}" if b.is_error else b.content
            else:
                got = _parts(b.content or [], f"{where}[{j}].content")
                if b.is_error and got and got[0][1] is None:
                    got[0] = ({"type": "text", "text": f"Error: {got[0][0]['text']}"}, None)
                elif b.is_error:
                    got.insert(0, ({"type": "text", "text": "Error:" if got else "Error: "}, None))
                result = _content(got, names, base + len(out))
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": result})
        else:
            raise _unreadable(b, f"{where}[{j}]")
    flush()
    return out


# chat's request paths, as this request sent them under Anthropic's names
CHAT_PATHS = PathNames((r"tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema"),
                       (r"tools\[(\d+)\]\.function\.name", r"tools[\1].name"),
                       (r"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
                       (r"response_format\.json_schema\.schema", "output_config.format.schema"),
                       (r"response_format", "output_config.format"))
# Phrases of chat's errors said Anthropic's way: tool_choice's 'required' is 'any' here.
WORDS = {**images.WORDS, "required": "'any'"}


CHAT_TOOL = re.compile(r"tools\[(\d+)\](?:\.function\.(parameters|name))?(?=[.\[]|$)")


def _tool_names(paths: list[str]) -> Callable[[str], str]:
    """Chat's path of tool k as the path it was sent under (``paths[k]``: tools[j] less the
    mcp_toolset entries, a tool change's definition, an MCP server's tool)."""
    def name(path: str) -> str:
        m = CHAT_TOOL.match(path)
        if m is None or int(m.group(1)) >= len(paths):
            return path
        field = {"parameters": ".input_schema", "name": ".name", None: ""}[m.group(2)]
        return paths[int(m.group(1))] + field + path[m.end():]
    return name


def chat_error(err: InvalidRequestError, names: dict[str, tuple[str, str]] | None = None,
               tools: list[str] | None = None) -> InvalidRequestError:
    """An error of the chat machinery, with the paths it names (its param, and those of its
    message) as this request sent them: under Anthropic's names (tools[0].function.parameters is
    tools[0].input_schema), an image part as the block it came from (``names``), and a tool as
    the entry it came from (``tools``: Translation.tools)."""
    blocks = images.block_names(names or {})
    tool = _tool_names(tools or [])
    return renamed(err, lambda path: CHAT_PATHS(tool(blocks(path))), WORDS)


def markdown_table() -> str:
    """The README's table of Messages parameters, generated from RULES."""
    return rules.markdown_table(RULES, (("Parameter", "name"), ("What happens", "action"),
                                        ("Chat parameter", "target"), ("Notes", "note")))
