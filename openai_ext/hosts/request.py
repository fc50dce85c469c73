"""The one request from the families to a host: how to generate (``GenerationSettings``) and how
to render a chat (``ChatOptions``).

``text.params.plan`` builds the first and ``text.chat.template_input`` the second, from any
API's request; each host translates them into its own vocabulary (the web UI's state dict in
hosts/textgen, llama.cpp's sampler chain, an upstream engine's request body). A misspelt
field is a type error here, where a misspelt dict key used to be a silent no-op.
"""

from __future__ import annotations

import contextvars
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

# Set in the context of a request the server sends for a batch (batches/run.py): its generations
# are background work, which a host serves after live clients' (text/generation.host_pieces reads
# it where the settings go to the host, so every family's requests carry it alike).
BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("background", default=False)


@dataclass(frozen=True)
class GenerationSettings:
    """What one generation asks of the host.

    The four OpenAI samplers are None where a web UI preset decides them (extension mode, a
    preset named and the sampler not). ``samplers`` holds the host's own samplers the request
    named (``base.HOST_SAMPLERS``), already checked against the host's abilities and coerced to
    their types; a host applies each or, if it cannot, says so in its abilities beforehand.
    Stop strings are not here: the server applies them to the text (holding back what may still
    become one) and stops the host, which would otherwise cut a partial one off its last text.
    """
    max_new_tokens: int
    temperature: float | None = 1.0      # 0: greedy decoding
    top_p: float | None = 1.0
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    seed: int | None = None              # None: random
    logit_bias: Mapping[int, float] = field(default_factory=dict)   # token id -> bias; -100 bans
    logprobs: int | None = None          # alternatives per token; None: no log-probabilities
    grammar: str | None = None           # GBNF the output follows ...
    grammar_triggers: tuple[str, ...] = ()   # ... from the first of these on (lazy), when any
    samplers: Mapping[str, Any] = field(default_factory=dict)
    preset: str | None = None            # the web UI's preset, by name (extension mode)
    max_tokens_second: int | None = None   # the web UI's output pacing (extension mode)
    background: bool = False             # a batch's line: served after live clients (BACKGROUND)

    @property
    def greedy(self) -> bool:
        """The most likely token every time (temperature 0)."""
        return self.temperature is not None and self.temperature <= 0

    def replace(self, **changes: Any) -> GenerationSettings:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ChatOptions:
    """How a host renders a chat: ``tools`` for templates that render tools themselves, and the
    web UI's own template fields (its chat modes, characters, templates and reasoning switches),
    which only a host with ``abilities.web_ui`` is ever given (text/webui_fields.py checks them)."""
    tools: list[dict[str, Any]] | None = None
    mode: str = "instruct"
    character: str | None = None
    instruction_template: str | None = None
    instruction_template_str: str | None = None
    chat_template_str: str | None = None
    name1: str | None = None
    name2: str | None = None
    context: str | None = None
    greeting: str | None = None
    user_bio: str | None = None
    chat_instruct_command: str | None = None
    continue_: bool = False
    enable_thinking: bool | None = None
    reasoning_effort: str | None = None

    def web_ui_fields(self) -> dict[str, Any]:
        """The template fields, by their names here; those the request left unset are left out
        (enable_thinking False is a setting: it turns thinking off)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "tools" and getattr(self, f.name) is not None}


NO_CHAT_OPTIONS = ChatOptions()
