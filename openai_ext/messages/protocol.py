"""Pydantic models of the Anthropic Messages requests this server accepts.

Shapes and ranges follow Anthropic's API reference (temperature 0-1, max_tokens at least 1 and
required), so a malformed request gets a 400 naming the field. Content blocks of a type this
server cannot read (image, document, the server tools' blocks ...) are parsed as ``OtherBlock``,
so that translate.py can say what is refused and why, instead of a generic schema error.
The requests are ``ApiModel``s: an unknown top-level field gets a 400 naming it, except the host's
own samplers and the web UI's fields, which translate.py passes on to chat. ``context_management``
and ``thread`` are read by context.py and threads.py (with ``parse``, so that an error names the
field inside them); context-management edits of a type not served here are parsed as ``OtherEdit``, for context.py
to say why they are refused. ``mcp_servers`` and the ``mcp_toolset`` entries of ``tools`` are
read by connector.py the same way (unknown keys there are a 400: a misspelt token or tool list
would change what runs); the MCP connector's ``mcp_tool_use`` and ``mcp_tool_result`` blocks come
back in assistant turns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
    ValidationError,
)

from ..core.api_model import ApiModel
from ..core.errors import from_validation_errors
from ..hosts.base import HOST_SAMPLERS
from ..text.webui_fields import ALL as WEB_UI_FIELDS


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(_Open):
    """Also carries cache_control and citations, which change nothing here."""
    type: Literal["text"]
    text: StrictStr


class ToolUseBlock(_Open):
    type: Literal["tool_use"]
    id: StrictStr
    name: StrictStr
    input: dict[str, Any]


class ToolResultBlock(_Open):
    type: Literal["tool_result"]
    tool_use_id: StrictStr
    content: Union[StrictStr, list["Block"], None] = None
    is_error: StrictBool | None = None


class ThinkingBlock(_Open):
    type: Literal["thinking"]
    thinking: StrictStr
    signature: StrictStr | None = None


class RedactedThinkingBlock(_Open):
    type: Literal["redacted_thinking"]
    data: StrictStr


class McpToolUseBlock(_Open):
    """A call the server made to an MCP server's tool (the MCP connector), sent back in history."""
    type: Literal["mcp_tool_use"]
    id: StrictStr
    name: StrictStr
    server_name: StrictStr
    input: dict[str, Any]


class McpToolResultBlock(_Open):
    """The result of an ``mcp_tool_use`` of the same assistant turn: a string or text blocks."""
    type: Literal["mcp_tool_result"]
    tool_use_id: StrictStr
    content: Union[StrictStr, list["Block"], None] = None
    is_error: StrictBool | None = None


class OtherBlock(_Open):
    """Image, document, search_result, the server tools' blocks ...: refused with a reason."""
    type: StrictStr


_KNOWN = {"text", "tool_use", "tool_result", "thinking", "redacted_thinking", "mcp_tool_use", "mcp_tool_result"}


def _type_of(value: Any) -> str | None:
    """The ``type`` a discriminator chooses by: a string, or None. A type that is not a string (a
    list, say) names no known model, and cannot be looked up in a set of names either; the model
    chosen for it refuses it with a 400."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


def _block_kind(value: Any) -> str:
    kind = _type_of(value)
    return kind if kind in _KNOWN else "other"


Block = Annotated[Union[
    Annotated[TextBlock, Tag("text")],
    Annotated[ToolUseBlock, Tag("tool_use")],
    Annotated[ToolResultBlock, Tag("tool_result")],
    Annotated[ThinkingBlock, Tag("thinking")],
    Annotated[RedactedThinkingBlock, Tag("redacted_thinking")],
    Annotated[McpToolUseBlock, Tag("mcp_tool_use")],
    Annotated[McpToolResultBlock, Tag("mcp_tool_result")],
    Annotated[OtherBlock, Tag("other")],
], Discriminator(_block_kind)]

ToolResultBlock.model_rebuild()
McpToolResultBlock.model_rebuild()


class SystemOutputConfig(_Open):
    """output_config of a system message: effort, per turn (ignored here, as at the top level)."""
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class InputMessage(_Open):
    """A turn. System messages stand where they are sent; their content may also hold
    tool_addition and tool_removal blocks (parsed as OtherBlock, read by offered.py). clear_at
    and output_config belong to system messages only (translate.py refuses them elsewhere)."""
    role: Literal["user", "assistant", "system"]
    content: Union[StrictStr, list[Block], None] = None
    clear_at: Literal["next_user_message", "never"] | None = None
    output_config: SystemOutputConfig | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None
    disable_parallel_tool_use: StrictBool | None = None


class Thinking(_Open):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: StrictInt | None = None


class Metadata(_Open):
    user_id: StrictStr | None = None


class OutputFormat(_Open):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Open):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


def _by_type(*models: type[_Open]) -> Any:
    """A union of ``models`` chosen by their ``type`` (tagged ``type-<type>``: ``parse`` leaves
    the tags out of error paths, so that a path names the fields a client sent)."""
    kinds = {get_args(m.model_fields["type"].annotation)[0]: m for m in models}

    def kind(value: Any) -> str | None:
        t = _type_of(value)
        return f"type-{t}" if t in kinds else None
    return Annotated[Union[tuple(Annotated[m, Tag(f"type-{k}")] for k, m in kinds.items())],
                     Discriminator(kind, custom_error_type="invalid_type",
                                   custom_error_message=f"type must be {' or '.join(repr(k) for k in kinds)}")]


class InputTokens(_Open):
    type: Literal["input_tokens"]
    value: StrictInt = Field(ge=1)


class ToolUses(_Open):
    type: Literal["tool_uses"]
    value: StrictInt = Field(ge=0)


class ThinkingTurns(_Open):
    type: Literal["thinking_turns"]
    value: StrictInt = Field(ge=1)


class AllThinkingTurns(_Open):
    type: Literal["all"]


if TYPE_CHECKING:   # the same unions as mypy sees them: a call cannot stand in a static type
    TurnsKept = Union[ThinkingTurns, AllThinkingTurns]
    Trigger = Union[InputTokens, ToolUses]
else:
    TurnsKept = _by_type(ThinkingTurns, AllThinkingTurns)
    Trigger = _by_type(InputTokens, ToolUses)


class ClearThinkingEdit(_Open):
    type: Literal["clear_thinking_20251015"]
    keep: Union[Literal["all"], TurnsKept, None] = None


class ClearToolUsesEdit(_Open):
    type: Literal["clear_tool_uses_20250919"]
    trigger: Union[Trigger, None] = None
    keep: ToolUses | None = None
    clear_at_least: InputTokens | None = None
    clear_tool_inputs: Union[StrictBool, list[StrictStr], None] = None
    exclude_tools: list[StrictStr] | None = None


class OtherEdit(_Open):
    """compact_20260112, or a type this server does not know: refused with a reason."""
    type: StrictStr


def _edit_kind(value: Any) -> str:
    kind = _type_of(value)
    return f"type-{kind}" if kind in ("clear_thinking_20251015", "clear_tool_uses_20250919") else "type-other"


Edit = Annotated[Union[
    Annotated[ClearThinkingEdit, Tag("type-clear_thinking_20251015")],
    Annotated[ClearToolUsesEdit, Tag("type-clear_tool_uses_20250919")],
    Annotated[OtherEdit, Tag("type-other")],
], Discriminator(_edit_kind)]


class ContextManagement(_Open):
    edits: list[Edit] | None = None


class ThreadCreate(_Open):
    type: Literal["create"]


class ThreadContinue(_Open):
    type: Literal["continue"]
    previous_message_id: StrictStr


class _Closed(BaseModel):
    """A request object whose misspelt keys would change what runs: unknown keys are a 400."""
    model_config = ConfigDict(extra="forbid")


class McpToolConfiguration(_Closed):
    """mcp_servers[].tool_configuration (beta mcp-client-2025-04-04)."""
    enabled: StrictBool | None = None
    allowed_tools: list[StrictStr] | None = None


class McpServerDefinition(_Closed):
    """One entry of ``mcp_servers``; its token is never shown (repr) nor kept."""
    type: Literal["url"]
    url: StrictStr
    name: StrictStr = Field(min_length=1)
    authorization_token: StrictStr | None = Field(None, repr=False)
    tool_configuration: McpToolConfiguration | None = None


class McpToolConfig(_Closed):
    """An mcp_toolset's default_config, or one of its configs (beta mcp-client-2025-11-20)."""
    enabled: StrictBool | None = None
    defer_loading: StrictBool | None = None


class McpToolset(_Closed):
    """A ``tools`` entry of type mcp_toolset (beta mcp-client-2025-11-20)."""
    type: Literal["mcp_toolset"]
    mcp_server_name: StrictStr
    default_config: McpToolConfig | None = None
    configs: dict[str, McpToolConfig] | None = None
    cache_control: dict[str, Any] | None = None
    tools: list[Any] | None = None     # a pinned listing: refused (connector.py)


Thread = _by_type(ThreadCreate, ThreadContinue)
_ADAPTERS: dict[int, TypeAdapter] = {}     # by the id of a module-level type: built once each


def parse(type_: Any, value: Any, name: str) -> Any:
    """The request field ``name`` as ``type_``: a 400 names the field inside it that is wrong.
    (The fields whose unions pydantic would report under their tags are parsed so, by the
    modules that read them.)"""
    adapter = _ADAPTERS.get(id(type_))
    if adapter is None:
        adapter = _ADAPTERS[id(type_)] = TypeAdapter(type_)
    try:
        return adapter.validate_python(value)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", name, *(p for p in err["loc"]
                                                  if not (isinstance(p, str) and p.startswith("type-"))))}
                  for err in e.errors()]
        raise from_validation_errors(errors) from None


class CountTokensRequest(ApiModel):
    """POST /v1/messages/count_tokens: what shapes the prompt, nothing that samples."""
    passes = frozenset({*HOST_SAMPLERS, *WEB_UI_FIELDS})   # mean here what they mean in chat
    hinted = tuple(HOST_SAMPLERS)
    # fields of POST /v1/messages that count_tokens does not take
    elsewhere = {"mcp_servers": "count_tokens does not list MCP servers' tools: count without mcp_servers (their "
                                "tools are left out of the count), or read usage.input_tokens of a /v1/messages "
                                "response."}
    model: StrictStr
    messages: Annotated[list[InputMessage], Field(min_length=1)]
    system: Union[StrictStr, list[TextBlock], None] = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None      # a ContextManagement, read by context.py
    # Not Anthropic's: Ollama's, how long a catalog model named here stays loaded (text.lanes)
    keep_alive: Union[float, StrictStr, None] = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""
    max_tokens: StrictInt = Field(ge=1)
    stop_sequences: list[StrictStr] | None = None
    stream: StrictBool | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: StrictInt | None = Field(None, ge=0)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: StrictStr | None = None
    speed: Literal["standard", "fast"] | None = None
    container: Any = None
    mcp_servers: list[Any] | None = None
    thread: dict[str, Any] | None = None     # a Thread, read by threads.py
    diagnostics: dict[str, Any] | None = None
    user_profile_id: StrictStr | None = None
    workspace_id: StrictStr | None = None
    # set by threads.py: where the reply goes when the request continues or creates a thread
