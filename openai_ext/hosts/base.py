"""The Host contract: what the API needs from a text-generation backend.

Two hosts implement it: ``textgen`` (the web UI that loads this extension) and ``llamacpp``
(the embedded llama.cpp host of standalone mode). The server never looks past this contract.
Its vocabulary (pieces, log-probabilities, abilities, the host's sampler names) lives here too,
with the request itself in request.py, so hosts depend on nothing but these two modules.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncGenerator, Generator

from .request import NO_CHAT_OPTIONS, ChatOptions, GenerationSettings

if TYPE_CHECKING:
    from PIL.Image import Image


@dataclass(slots=True)
class TokenLogprob:
    """One sampled token with its log-probability and the most likely alternatives."""
    token: str
    logprob: float
    bytes: list[int] | None
    top: list[tuple[str, float, list[int] | None]] = field(default_factory=list)


@dataclass(slots=True)
class Piece:
    """What a host yields: a stretch of new text, never a partial UTF-8 character.

    ``tokens`` is how many sampled tokens produced it (None when the host cannot tell; the
    count is then taken from the tokenizer at the end). ``logprob`` is set by hosts that can
    report it, one piece per token. ``finish_reason`` is set on the host's last piece.
    """
    text: str
    tokens: int | None = 1
    logprob: TokenLogprob | None = None
    finish_reason: str | None = None


# A host's reply: a generator, which the server closes when the client leaves or a stop string
# ends the reply early (the host's finally then releases what it holds).
Pieces = Generator[Piece, None, None]


@dataclass(frozen=True)
class HostAbilities:
    """What a host can do, as far as the mapping is concerned."""
    samplers: frozenset[str]
    logprobs: bool = False
    logit_bias: bool = False
    fim: bool = False
    vocab_size: int | None = None
    grammar: bool = False          # applies a GBNF grammar (grammar_string)
    lazy_grammar: bool = False     # ... from a trigger pattern on (grammar_triggers)
    prompt_logprobs: bool | None = None   # scores a prompt (completions echo); None: as logprobs
    parallel: int = 1              # generations it runs at once (parallel slots, or sequences of one batch)
    web_ui: bool = False           # renders the web UI's chat modes, characters, templates, presets
    vision: bool = False           # reads images (<__media__> placeholders in the prompt, Prompt.images)

    @property
    def scores_prompts(self) -> bool:
        return self.logprobs if self.prompt_logprobs is None else self.prompt_logprobs


# Extra request fields that name the host's own samplers, with their types. The host says which
# of them it supports; others get a 400 naming them.
HOST_SAMPLERS: dict[str, type] = {
    "top_k": int, "min_p": float, "typical_p": float, "top_n_sigma": float,
    "repetition_penalty": float, "repetition_penalty_range": int,
    "encoder_repetition_penalty": float, "no_repeat_ngram_size": int,
    "xtc_threshold": float, "xtc_probability": float,
    "dry_multiplier": float, "dry_base": float, "dry_allowed_length": int,
    "mirostat_mode": int, "mirostat_tau": float, "mirostat_eta": float,
    "dynamic_temperature": bool, "dynatemp_low": float, "dynatemp_high": float, "dynatemp_exponent": float,
    "smoothing_factor": float, "smoothing_curve": float, "temperature_last": bool,
    "epsilon_cutoff": float, "eta_cutoff": float, "tfs": float, "top_a": float,
    "penalty_alpha": float, "guidance_scale": float, "negative_prompt": str,
    "ban_eos_token": bool, "add_bos_token": bool, "skip_special_tokens": bool,
    "custom_token_bans": str, "sampler_priority": str, "dry_sequence_breakers": str,
    "prompt_lookup_num_tokens": int, "static_cache": bool,
}


@dataclass
class Prompt:
    """A prompt as text and as the model's token ids (both are kept so no host tokenizes twice),
    with the stop strings its chat template implies. ``trim_start``: the reply is shown without
    its leading whitespace (the web UI's chat modes, where the model writes "Name: reply")."""
    text: str
    tokens: list[int]
    stops: list[str] = field(default_factory=list)
    trim_start: bool = False
    images: list[Image] = field(default_factory=list)   # PIL images, one per <__media__> placeholder


@dataclass
class ChatPrompt:
    text: str
    stops: list[str] = field(default_factory=list)
    trim_start: bool = False


class Host(ABC):
    model_id: str
    owned_by: str = "local"
    created: int = 0
    abilities: HostAbilities
    chat_template: str | None = None   # the Jinja source, to tell whether it renders tools itself
    # The most bytes one token stands for, or an upper bound of it: text longer than the context
    # times this cannot fit, which is known before tokenizing it. 256 is above any real vocabulary's
    # longest token; a host that knows its vocabulary sets the true figure.
    max_token_bytes: int = 256

    @property
    def loaded(self) -> bool:
        return True

    @abstractmethod
    def context_length(self) -> int:
        """Tokens the model can see: prompt plus completion."""

    @abstractmethod
    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        """Token ids as the model would see ``text`` as a prompt (``add_bos``) or as output."""

    def prompt_tokens(self, text: str, images: list[Image]) -> list[int]:
        """The prompt's token ids, each image counted as the tokens the model reads for it (a
        host with vision); by default, the text's."""
        return self.tokenize(text)

    @abstractmethod
    def detokenize(self, tokens: list[int]) -> str:
        ...

    @abstractmethod
    def chat_prompt(self, messages: list[dict[str, Any]], options: ChatOptions = NO_CHAT_OPTIONS) -> ChatPrompt:
        """Renders OpenAI-style messages (roles system/user/assistant/tool, string content)
        with the model's chat template, ready for the assistant's reply. ``options.tools``,
        when set, is handed to templates that render tools themselves."""

    @abstractmethod
    def generate(self, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event) -> Pieces:
        """Blocking generator of pieces. It runs on a worker thread, checks ``stop_event``
        between tokens, and sets ``finish_reason`` ("stop" or "length") on its last piece."""

    def stream(self, prompt: Prompt, settings: GenerationSettings,
               stop_event: threading.Event) -> AsyncGenerator[Piece, None] | None:
        """The same pieces read in the event loop, for a host that generates on a thread of its
        own (the embedded batch): no worker thread between it and the client. Closing the
        iterator returns once the host has stopped. None (the default): ``generate`` is run on
        a worker thread instead."""
        return None

    def document_start(self) -> list[int]:
        """The tokens an empty prompt stands for (a new document)."""
        return self.tokenize("")

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        raise NotImplementedError

    def prompt_logprobs(self, tokens: list[int], top: int) -> list[TokenLogprob]:
        """Scores of the prompt's visible tokens (a leading BOS is left out), for echo."""
        raise NotImplementedError

    def check_prompt_scoring(self) -> None:  # noqa: B027 - an optional hook
        """Refuses (InvalidRequestError) echo with log-probabilities when the loaded model turns
        out unable to score a prompt, before anything runs. Called for such requests only."""

    def check_grammar(self, gbnf: str) -> bool:
        """Whether the host can parse this GBNF grammar (checked before anything runs). Hosts
        that cannot tell say yes, and an unparsable grammar fails while generating."""
        return True

    def check_settings(self, settings: GenerationSettings) -> None:  # noqa: B027 - an optional hook
        """Refuses (InvalidRequestError) settings that name what the host does not have (a
        preset, say), before anything runs."""

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        """(thinking, answer) of a reply so far; thinking is None when the reply has none. A
        reply that may still be opening a thinking block gives ("", "")."""
        return split_think_tags(text)

    def next_token_probabilities(self, prompt: str, settings: GenerationSettings, use_samplers: bool,
                                 top: int) -> dict[str, float]:
        """The ``top`` most likely next tokens after ``prompt`` with their probabilities, from
        the model's own distribution or, with ``use_samplers``, after the request's samplers
        (the web UI's /v1/internal/logits)."""
        raise NotImplementedError

    def stop_all(self) -> None:  # noqa: B027 - an optional hook
        """Asks any running generation to stop (internal stop-generation endpoint)."""

    def unavailable(self) -> Exception | None:
        """Why the loaded model cannot answer now (its server process has died, say), as the
        error to answer with; None while it can."""
        return None

    def readiness(self) -> dict[str, Any] | None:
        """For health checks, where the host depends on something it checks by itself (an
        upstream engine): {"ready", "error", ...} as last seen, never waiting; None where
        ``unavailable()`` says it all."""
        return None

    def kv_cells(self) -> dict[str, int] | None:
        """KV cache cells in use and in all ({"used", "total"}), where the host can tell."""
        return None

    def sequences(self) -> dict[str, int] | None:
        """Where the host batches: its sequences running, those waiting for a slot or for cells,
        and the most that may run ({"running", "waiting", "slots"})."""
        return None

    def image_model(self) -> Any:
        """An image model the host has loaded beside its text model (the web UI's Image tab:
        hosts/textgen/images.WebUiImages), or None."""
        return None

    def close(self) -> None:  # noqa: B027 - an optional hook
        pass

    def describe(self) -> dict[str, Any]:
        return {"model_name": self.model_id}


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_think_tags(text: str) -> tuple[str | None, str]:
    """The common thinking format: a <think>...</think> block first (or only its end, from
    templates that open it themselves, as Qwen3's does when thinking is on)."""
    stripped = text.lstrip()
    if stripped and THINK_OPEN.startswith(stripped):
        return "", ""   # the tag may be arriving
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN):]
        end = body.find(THINK_CLOSE)
        if end == -1:
            return body, ""
        return body[:end], body[end + len(THINK_CLOSE):].lstrip()
    end = text.find(THINK_CLOSE)
    if end != -1:
        return text[:end], text[end + len(THINK_CLOSE):].lstrip()
    return None, text
