"""The Host contract: what the API needs from a text-generation backend.

Two hosts implement it: ``textgen`` (the web UI that loads this extension) and ``llamacpp``
(the embedded llama.cpp host of standalone mode). The server never looks past this contract.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..assembly import Piece, TokenLogprob
from ..params import HostAbilities


@dataclass
class Prompt:
    """A prompt as text and as the model's token ids (both are kept so no host tokenizes twice),
    with the stop strings its chat template implies."""
    text: str
    tokens: list[int]
    stops: list[str] = field(default_factory=list)


@dataclass
class ChatPrompt:
    text: str
    stops: list[str] = field(default_factory=list)


class Host(ABC):
    model_id: str
    owned_by: str = "local"
    created: int = 0
    abilities: HostAbilities
    chat_template: str | None = None   # the Jinja source, to tell whether it renders tools itself

    @property
    def loaded(self) -> bool:
        return True

    @abstractmethod
    def context_length(self) -> int:
        """Tokens the model can see: prompt plus completion."""

    @abstractmethod
    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        """Token ids as the model would see ``text`` as a prompt (``add_bos``) or as output."""

    @abstractmethod
    def detokenize(self, tokens: list[int]) -> str:
        ...

    @abstractmethod
    def chat_prompt(self, messages: list[dict[str, Any]], settings: dict[str, Any]) -> ChatPrompt:
        """Renders OpenAI-style messages (roles system/user/assistant/tool, string content)
        with the model's chat template, ready for the assistant's reply. ``settings['tools']``,
        when present, is handed to templates that render tools themselves."""

    @abstractmethod
    def generate(self, prompt: Prompt, settings: dict[str, Any], stop_event: threading.Event) -> Iterator[Piece]:
        """Blocking generator of pieces. It runs on a worker thread, checks ``stop_event``
        between tokens, and sets ``finish_reason`` ("stop" or "length") on its last piece."""

    def document_start(self) -> list[int]:
        """The tokens an empty prompt stands for (a new document)."""
        return self.tokenize("")

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        raise NotImplementedError

    def prompt_logprobs(self, tokens: list[int], top: int) -> list[TokenLogprob]:
        """Scores of the prompt's visible tokens (a leading BOS is left out), for echo."""
        raise NotImplementedError

    def stop_all(self) -> None:
        """Asks any running generation to stop (internal stop-generation endpoint)."""

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"model_name": self.model_id}
