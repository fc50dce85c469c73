"""Pydantic models of the Responses and Conversations API requests this server accepts.

Ranges follow OpenAI's spec (``max_output_tokens`` at least 16, ``top_logprobs`` 0-20 ...), so
an out-of-range value gets a 400 naming the parameter. Input items are kept as plain objects here
and read one by one in ``items.py``, where each error can name the item and the field that is
wrong. The requests are ``ApiModel``s: an unknown top-level field gets a 400 naming it (a chat
parameter, what to send here instead), except the host's samplers and the web UI's fields, which
``convert.py`` hands on to chat, as chat takes them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

from ..core.api_model import ApiModel
from ..hosts.base import HOST_SAMPLERS
from ..text.webui_fields import ALL as WEB_UI_FIELDS


class _Open(BaseModel):
    """A part of a request: fields it does not declare are kept, and left unused."""
    model_config = ConfigDict(extra="allow")


# Chat parameters a client may send here by mistake, with what /v1/responses takes instead.
_INSTEAD = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
            "response_format": "text.format", "logprobs": 'include: ["message.output_text.logprobs"]',
            "functions": "tools", "function_call": "tool_choice", "reasoning_effort": "reasoning.effort",
            "verbosity": "text.verbosity"}
_NO_COUNTERPART = ("stop", "seed", "n", "logit_bias", "modalities", "audio",
                   "prediction", "web_search_options", "best_of", "echo", "suffix")
CHAT_ONLY = {**{k: f"It is a parameter of /v1/chat/completions; here, use {v}." for k, v in _INSTEAD.items()},
             **{k: "It is a parameter of /v1/chat/completions, with no counterpart here." for k in _NO_COUNTERPART}}


def check_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's limits: 16 pairs, keys up to 64 characters, string values up to 512."""
    if value is None:
        return None
    if len(value) > 16:
        raise ValueError("metadata holds at most 16 key-value pairs")
    for key, item in value.items():
        if len(key) > 64:
            raise ValueError(f"metadata key {key[:20]!r}... is longer than 64 characters")
        if not isinstance(item, str):
            raise ValueError(f"metadata value of {key!r} must be a string")
        if len(item) > 512:
            raise ValueError(f"metadata value of {key!r} is longer than 512 characters")
    return value


Metadata = Annotated[dict[str, Any], AfterValidator(check_metadata)]
Items = list[dict[str, Any]]


class TextConfig(_Open):
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(_Open):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None
    context: str | None = None
    mode: str | None = None


class ConversationRef(_Open):
    id: StrictStr


IncludeName = Literal["file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
                      "message.input_image.image_url", "computer_call_output.output.image_url",
                      "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs"]


class _Common(ApiModel):
    """What a response request and a token count share: everything that shapes the prompt."""
    passes = frozenset({*HOST_SAMPLERS, *WEB_UI_FIELDS})   # handed on to chat (convert.host_extras)
    elsewhere = CHAT_ONLY
    hinted = tuple(HOST_SAMPLERS)
    model: str | None = None
    input: Union[StrictStr, Items, None] = None
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: Union[StrictStr, ConversationRef, None] = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Not OpenAI's: Ollama's, how long a catalog model named here stays loaded (text.lanes)
    keep_alive: Union[float, StrictStr, None] = None

    @property
    def input_list(self) -> Items:
        """The input items as sent (a string input holds none)."""
        return self.input if isinstance(self.input, list) else []


class CreateResponse(_Common):
    max_output_tokens: int | None = Field(None, ge=16)
    max_tool_calls: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    # Open Responses' request body has them (OpenAI's has not): chat's ranges and meaning
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[IncludeName] | None = None
    metadata: Metadata | None = None
    user: str | None = None
    safety_identifier: str | None = Field(None, max_length=64)
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    store: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None
    # Not in OpenAI's spec: Codex CLI sends it with every request (string pairs about the client).
    client_metadata: dict[str, Any] | None = None


class InputTokensRequest(_Common):
    """POST /v1/responses/input_tokens (OpenAI's TokenCountsBody)."""
    personality: str | None = None


class CompactRequest(ApiModel):
    """POST /v1/responses/compact (OpenAI's CompactResponseMethodPublicBody): model is required there,
    as in Open Responses' schema (any name is taken, as elsewhere)."""
    model: str
    input: Union[StrictStr, Items, None] = None
    previous_response_id: str | None = None
    instructions: str | None = None
    prompt_cache_key: str | None = Field(None, max_length=64)
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    keep_alive: Union[float, StrictStr, None] = None
    service_tier: str | None = None


class CreateConversation(ApiModel):
    metadata: Metadata | None = None
    items: Annotated[Items, Field(max_length=20)] | None = None


class UpdateConversation(ApiModel):
    metadata: Metadata


class AddItems(ApiModel):
    items: Annotated[Items, Field(min_length=1, max_length=20)]
