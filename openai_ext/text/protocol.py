"""Pydantic models of the OpenAI requests this server accepts.

A field left out (or sent as null) stays ``None`` here; the defaults OpenAI documents are
applied in ``params.py``, next to the rest of the mapping, so there is one place to read them.
Ranges follow OpenAI's spec, so an out-of-range value gets a 400 naming the parameter.
The requests are ``ApiModel``s: an unknown field is refused with a 400 that names it (unless the
allow_unknown_fields setting is on), except the host's samplers and the web UI's own fields, which
pass to ``params.py``: it maps the samplers the loaded host has and the web UI's fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr, field_validator

from ..core.api_model import ApiModel
from ..hosts.base import HOST_SAMPLERS
from . import webui_fields


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


def _not_bool(value: Any) -> Any:
    # JSON's true and false are not numbers, though Python counts them as 0 and 1: OpenAI refuses
    # `top_p: false`, and so does this server, naming the field.
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


Number = Annotated[float, BeforeValidator(_not_bool)]
Integer = Annotated[int, BeforeValidator(_not_bool)]

Stop = Union[StrictStr, Annotated[list[StrictStr], Field(max_length=4)], None]
LogitBias = dict[str, Annotated[Number, Field(ge=-100, le=100)]]
TokenIds = Annotated[list[StrictInt], Field(min_length=1)]


class _Sampling(ApiModel):
    """Parameters chat and completions share."""
    hinted = tuple(HOST_SAMPLERS)
    model: str | None = None
    frequency_penalty: Number | None = Field(None, ge=-2, le=2)
    presence_penalty: Number | None = Field(None, ge=-2, le=2)
    logit_bias: LogitBias | None = None
    max_tokens: Integer | None = Field(None, ge=0)
    n: Integer | None = Field(None, ge=1, le=128)
    seed: Integer | None = None
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = Field(None, ge=0, le=1)
    user: str | None = None
    service_tier: str | None = None   # OpenAI's, taken and ignored on both endpoints (params.RULES)
    keep_alive: Union[Number, StrictStr, None] = None   # Ollama's: how long a catalog model stays loaded

    def sent_extra(self) -> dict[str, Any]:
        """The extra fields (the host's samplers, the web UI's fields) sent with a value: null is
        as good as left out, as for the declared fields (params.plan), so the host's or the web
        UI preset's value stands."""
        return {name: value for name, value in (self.model_extra or {}).items() if value is not None}


class CompletionRequest(_Sampling):
    prompt: Union[StrictStr, list[StrictStr], TokenIds, Annotated[list[TokenIds], Field(min_length=1)]]
    best_of: Integer | None = Field(None, ge=0, le=20)
    echo: bool | None = None
    logprobs: Integer | None = Field(None, ge=0, le=5)
    suffix: str | None = None


class TextPart(_Open):
    type: Literal["text"]
    text: StrictStr


class RefusalPart(_Open):
    type: Literal["refusal"]
    refusal: StrictStr


class OtherPart(_Open):
    """Image, audio and file parts: parsed so the error can say what is not supported."""
    type: Literal["image_url", "input_audio", "file"]


ContentPart = Annotated[Union[TextPart, RefusalPart, OtherPart], Field(discriminator="type")]


class ToolCallFunction(_Open):
    name: StrictStr
    arguments: StrictStr


class ToolCall(_Open):
    id: StrictStr
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[StrictStr, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    function_call: ToolCallFunction | None = None   # legacy: an assistant's call of a function

    @field_validator("tool_calls")
    @classmethod
    def _empty_tool_calls(cls, v):
        return v or None


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Integer | None = Field(None, ge=0)
    logprobs: bool | None = None
    top_logprobs: Integer | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Union[str, dict[str, Any], None] = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    # OpenAI's, taken and ignored (params.RULES says why)
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    safety_identifier: Any = None
    moderation: Any = None

    passes = frozenset({*HOST_SAMPLERS, *webui_fields.ALL})


# A completion takes the web UI's generation fields, not the ones that shape a chat prompt.
_TEMPLATE = {*webui_fields.TEMPLATE_FIELDS, *webui_fields.ALIASES}
CompletionRequest.passes = frozenset({*HOST_SAMPLERS, *(webui_fields.ALL - _TEMPLATE)})
CompletionRequest.elsewhere = {name: "It is a parameter of /v1/chat/completions." for name in
                               {*ChatCompletionRequest.model_fields, *_TEMPLATE} - set(CompletionRequest.model_fields)}
ChatCompletionRequest.elsewhere = {name: "It is a parameter of /v1/completions." for name in
                                   set(CompletionRequest.model_fields) - set(ChatCompletionRequest.model_fields)}
