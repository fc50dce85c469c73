"""The web UI host: generation through the ``modules`` package of the web UI that loads us.

Everything goes through the host: its model and tokenizer, its context length
(``truncation_length``), its ``generate_reply`` (which takes ``shared.generation_lock`` itself),
its settings dict as the base of every request's state, and its chat prompt builder with the
model's instruction template.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import logging
import threading
from types import SimpleNamespace
from typing import Any, Iterator

from ..assembly import Piece
from .. import grammar
from ..errors import InvalidRequestError
from ..params import HOST_SAMPLERS, HostAbilities
from .base import ChatPrompt, Host, Prompt

log = logging.getLogger(__name__)

# The web UI truncates chat history to fit truncation_length; the server checks the length
# itself (and answers context_length_exceeded), so the prompt builder is told not to cut.
_NO_TRUNCATION = 10 ** 9


def import_host_modules() -> SimpleNamespace:
    names = ("shared", "text_generation", "chat", "models", "utils", "LoRA", "loaders", "models_settings")
    return SimpleNamespace(**{n: importlib.import_module(f"modules.{n}") for n in names})


def messages_to_history(messages: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """Converts OpenAI messages into the web UI's chat history.

    Returns (user_input, leading system text, history). Leading system messages become the
    host's ``custom_system_message``; later ones keep their place as system rows, so no system
    message is dropped. ``user_input`` is the last user message when nothing answered it yet.
    """
    system: list[str] = []
    rows: list[list[Any]] = []
    pending: str | None = None
    started = False

    def flush_user():
        nonlocal pending
        if pending is not None:
            rows.append([pending, "", "", {}])
            pending = None

    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "system" and not started:
            system.append(content)
            continue
        started = True
        if role == "system":
            flush_user()
            rows.append([content, "", "", {"role": "system"}])
        elif role == "user":
            flush_user()
            pending = content
        elif role == "assistant":
            meta = {"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {}
            rows.append([pending or "", content, "", meta])
            pending = None
        elif role == "tool":
            flush_user()
            rows.append(["", "", content, {"tool_call_id": m.get("tool_call_id")} if m.get("tool_call_id") else {}])
    history = {"internal": rows, "visible": copy.deepcopy(rows), "metadata": {}}
    return pending or "", "\n".join(system), history


@functools.lru_cache(maxsize=16)
def _abilities(loader: str | None, samplers: frozenset[str]) -> HostAbilities:
    return HostAbilities(
        samplers=samplers,
        logprobs=False,
        # The host forwards logit_bias to llama.cpp; its other loaders would ignore it.
        logit_bias=loader == "llama.cpp",
        # These loaders apply the host's grammar_string; none has a lazy (triggered) grammar.
        grammar=loader in ("llama.cpp", "Transformers", "ExLlamav3_HF") and grammar.available(),
    )


class TextgenHost(Host):
    owned_by = "local"

    def __init__(self, modules: SimpleNamespace | None = None):
        self.m = modules or import_host_modules()

    @property
    def abilities(self) -> HostAbilities:
        """Read for each request: the user may load another model, with another loader, in the
        web UI while the server runs."""
        shared = self.m.shared
        loader = getattr(getattr(shared, "args", None), "loader", None)
        return _abilities(loader, frozenset(k for k in HOST_SAMPLERS if k in shared.settings))

    @property
    def chat_template(self) -> str | None:
        return self.m.shared.settings.get("instruction_template_str")

    @property
    def model_id(self) -> str:
        return str(self.m.shared.model_name)

    @property
    def loaded(self) -> bool:
        return self.m.shared.model is not None and self.model_id not in ("", "None")

    def context_length(self) -> int:
        return int(self.m.shared.settings["truncation_length"])

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        # add_special_tokens too: on Transformers, add_bos_token=False alone still adds BOS
        ids = self.m.text_generation.encode(text, add_special_tokens=add_bos, add_bos_token=add_bos)
        # encode() gives a (1, n) numpy array or torch tensor, depending on the loader
        return [int(t) for t in ids[0].tolist()]

    def detokenize(self, tokens: list[int]) -> str:
        # Special tokens are kept: a prompt rebuilt from its tokens (a cut prompt, or token-id
        # input) must keep its chat template's markers.
        return self.m.text_generation.decode([int(t) for t in tokens], skip_special_tokens=False)

    def _state(self, settings: dict[str, Any]) -> dict[str, Any]:
        # Missing keys make the host's loaders fail silently, so start from all of its settings.
        state = copy.deepcopy(self.m.shared.settings)
        state.update(settings)
        state["mode"] = "instruct"
        return state

    def chat_prompt(self, messages: list[dict[str, Any]], settings: dict[str, Any]) -> ChatPrompt:
        user_input, system, history = messages_to_history(messages)
        state = self._state(settings)
        state.update(history=history, custom_system_message=system, truncation_length=_NO_TRUNCATION,
                     max_new_tokens=0)
        try:
            text = self.m.chat.generate_chat_prompt(user_input, state)
        except Exception as e:
            raise InvalidRequestError(f"The model's instruction template could not render these messages ({e}).",
                                      param="messages") from None
        return ChatPrompt(text, list(self.m.chat.get_stopping_strings(state)))

    def generate(self, prompt: Prompt, settings: dict[str, Any], stop_event: threading.Event) -> Iterator[Piece]:
        state = self._state(settings)
        state["stop_event"] = stop_event
        emitted = ""
        replies = self.m.text_generation.generate_reply(prompt.text, state, stopping_strings=list(prompt.stops),
                                                        is_chat=False)
        # closing() matters: the host releases its generation lock in the generator's finally.
        with contextlib.closing(replies):
            for text in replies:
                # The host yields the whole reply so far; only growth is new text. (A last
                # yield rewritten by output hooks cannot be unsent, so it is not followed.)
                if len(text) > len(emitted) and text.startswith(emitted):
                    yield Piece(text[len(emitted):], tokens=None)
                    emitted = text
                if stop_event.is_set():
                    return
        produced = len(self.tokenize(emitted, add_bos=False)) if emitted else 0
        finish = "length" if produced >= int(settings.get("max_new_tokens", 0)) > 0 else "stop"
        yield Piece("", tokens=None, finish_reason=finish)

    def stop_all(self) -> None:
        self.m.text_generation.stop_everything_event()

    def describe(self) -> dict[str, Any]:
        shared = self.m.shared
        return {"model_name": self.model_id, "lora_names": list(getattr(shared, "lora_names", []) or []),
                "loader": getattr(getattr(shared, "args", None), "loader", None)}
