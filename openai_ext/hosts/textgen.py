"""The web UI host: generation through the ``modules`` package of the web UI that loads us.

Everything goes through the host: its model and tokenizer, its context length
(``truncation_length``), its ``generate_reply`` (which takes ``shared.generation_lock`` itself),
its settings dict as the base of every request's state, and its chat prompt builder with the
model's instruction template. Stop strings are the exception: the server applies them itself
(see ``TextgenHost.generate``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import logging
import os
import threading
from types import SimpleNamespace
from typing import Any, Iterator

from ..core.errors import InvalidRequestError, ServiceUnavailableError
from .base import HOST_SAMPLERS, ChatPrompt, Host, HostAbilities, Piece, Prompt

log = logging.getLogger(__name__)

# The web UI truncates chat history to fit truncation_length; the server checks the length
# itself (and answers context_length_exceeded), so the prompt builder is told not to cut.
_NO_TRUNCATION = 10 ** 9

# What a decoder shows for a character whose bytes have not all been generated yet.
REPLACEMENT = "\ufffd"


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
        grammar=loader in ("llama.cpp", "Transformers", "ExLlamav3_HF"),
    )


class TextgenHost(Host):
    owned_by = "local"

    def __init__(self, modules: SimpleNamespace | None = None):
        self.m = modules or import_host_modules()
        self._wake_lock = threading.Lock()

    @property
    def abilities(self) -> HostAbilities:
        """Read for each request: the user may load another model, with another loader, in the
        web UI while the server runs."""
        loader = getattr(getattr(self.m.shared, "args", None), "loader", None)
        return _abilities(loader, self._samplers(loader))

    def _samplers(self, loader: str | None) -> frozenset[str]:
        """The host samplers a request may set: those of the web UI's settings that its loader
        applies (``modules.loaders.loaders_samplers``). The loader would drop any other one
        silently, so the request gets a 400 naming it instead. A loader the table does not list
        (an older web UI) keeps every sampler of the settings."""
        names = {k for k in HOST_SAMPLERS if k in self.m.shared.settings}
        table = getattr(getattr(self.m, "loaders", None), "loaders_samplers", None)
        if isinstance(table, dict) and loader in table:
            names &= set(table[loader])
        return frozenset(names)

    @property
    def chat_template(self) -> str | None:
        return self.m.shared.settings.get("instruction_template_str")

    @property
    def model_id(self) -> str:
        return str(self.m.shared.model_name)

    @property
    def loaded(self) -> bool:
        if self.model_id in ("", "None"):
            return False
        return self.m.shared.model is not None or self._idle_unloaded()

    def _idle_unloaded(self) -> bool:
        """The web UI's --idle-timeout unloads an idle model but keeps its name, and loads it
        again when it is next used (``models.load_model_if_idle_unloaded``)."""
        shared = self.m.shared
        return (shared.model is None and self.model_id not in ("", "None")
                and (getattr(getattr(shared, "args", None), "idle_timeout", 0) or 0) > 0
                and hasattr(self.m.models, "load_model_if_idle_unloaded"))

    def _require_model(self) -> None:
        """Called before anything that needs the model. An idle-unloaded model is loaded again
        with the web UI's own function; that takes seconds, and it does not block the event
        loop as this runs on the server's worker threads (prepare, generation)."""
        if self.m.shared.model is not None:
            return
        if self._idle_unloaded():
            with self._wake_lock:   # one load, however many requests arrive at once
                if self.m.shared.model is None:
                    log.info("loading %s again (the web UI unloaded it while idle)", self.model_id)
                    self.m.models.load_model_if_idle_unloaded()
        if self.m.shared.model is None:
            raise ServiceUnavailableError("No model is loaded. Load one in the web UI, or with POST "
                                          "/v1/internal/model/load.", code="model_not_loaded")

    def context_length(self) -> int:
        return int(self.m.shared.settings["truncation_length"])

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        self._require_model()
        # add_special_tokens too: on Transformers, add_bos_token=False alone still adds BOS
        ids = self.m.text_generation.encode(text, add_special_tokens=add_bos, add_bos_token=add_bos)
        # encode() gives a (1, n) numpy array or torch tensor, depending on the loader
        return [int(t) for t in ids[0].tolist()]

    def detokenize(self, tokens: list[int]) -> str:
        # Special tokens are kept: a prompt rebuilt from its tokens (a cut prompt, or token-id
        # input) must keep its chat template's markers.
        self._require_model()
        return self.m.text_generation.decode([int(t) for t in tokens], skip_special_tokens=False)

    def _state(self, settings: dict[str, Any]) -> dict[str, Any]:
        # Missing keys make the host's loaders fail silently, so start from all of its settings.
        state = copy.deepcopy(self.m.shared.settings)
        state.update(settings)
        state["mode"] = "instruct"
        return state

    def chat_prompt(self, messages: list[dict[str, Any]], settings: dict[str, Any]) -> ChatPrompt:
        self._require_model()   # the prompt builder may count tokens
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
        """The host's reply as pieces, each with the tokens it took, the last with the finish reason.

        The host is given no stop strings: the server applies them to this text (holding back
        what could still become one) and stops the host through ``stop_event``. Given stop
        strings, the host would cut a partial one off the end of its final text, and that text
        would no longer show how much was generated.
        """
        self._require_model()
        state = self._state(settings)
        # stream: without it the host generates the whole reply before it yields anything, and
        # the server could not stop it at a stop string.
        state.update(stop_event=stop_event, custom_stopping_strings=[], stream=True)
        follow = _Follower()
        reported = 0
        replies = self.m.text_generation.generate_reply(prompt.text, state, stopping_strings=[], is_chat=False)
        # closing() matters: the host releases its generation lock in the generator's finally.
        with contextlib.closing(replies):
            for text in replies:
                new = follow.follow(text)
                if new:
                    yield Piece(new, tokens=follow.steps - reported)
                    reported = follow.steps
                if stop_event.is_set():
                    return
        tail = follow.finish()
        limit = int(settings.get("max_new_tokens", 0))
        produced = self._produced(follow)
        # The host stopped by itself: at an end-of-text token, or at max_new_tokens (then it
        # generated exactly that many).
        finish = "length" if produced >= limit > 0 else "stop"
        total = limit if finish == "length" else produced
        yield Piece(tail, tokens=max(0, total - reported), finish_reason=finish)

    def _produced(self, follow: "_Follower") -> int:
        """How many tokens the host generated. It reports text, not tokens, so this is the
        larger of two lower bounds: the yields that brought new text (one token at least each),
        and the token count of the whole untrimmed text (a tokenizer may merge what the model
        generated as several tokens)."""
        counted = len(self.tokenize(follow.text, add_bos=False)) if follow.text else 0
        return max(follow.steps, counted)

    def stop_all(self) -> None:
        self.m.text_generation.stop_everything_event()

    def describe(self) -> dict[str, Any]:
        shared = self.m.shared
        return {"model_name": self.model_id, "lora_names": list(getattr(shared, "lora_names", []) or []),
                "loader": getattr(getattr(shared, "args", None), "loader", None)}


class _Follower:
    """Turns the cumulative texts the host yields into new text to send.

    - A trailing U+FFFD is held back: some loaders decode the whole reply at each step, so a
      character whose bytes span two tokens shows as U+FFFD until its last token arrives.
    - If the host changes text it yielded before, what was sent cannot be unsent. When the host
      goes on from the changed text, it is followed: from their longest common prefix on, the
      characters already sent stand for as many of the host's, and what lies beyond is new.
      A change in the host's very last yield (its output hooks may rewrite the whole reply)
      is not followed.
    """

    def __init__(self):
        self.text = ""          # the host's last text followed, as it yielded it
        self.steps = 0          # texts followed: each came from one token at least
        self._base = ""         # that text without a trailing U+FFFD
        self._sent = 0          # characters sent; the client's text stands for _base[:_sent]
        self._changed: str | None = None   # a text that changed sent text, not yet followed

    def follow(self, text: str) -> str:
        out = ""
        if self._changed is not None:   # more text came after the change: follow it
            out += self._take(self._changed)
            self._changed = None
        if text == self.text:
            return out
        if text.rstrip(REPLACEMENT).startswith(self._base[:self._sent]):
            out += self._take(text)
        else:
            self._changed = text
        return out

    def finish(self) -> str:
        """What is left to send once the host has stopped: a U+FFFD that no later token
        completed is the model's real output."""
        self._changed = None
        out = self.text[self._sent:]
        self._sent = max(self._sent, len(self.text))
        return out

    def _take(self, text: str) -> str:
        base = text.rstrip(REPLACEMENT)
        if not base.startswith(self._base[:self._sent]):
            common = len(os.path.commonprefix([base, self._base[:self._sent]]))
            log.debug("the host changed its reply after %d characters; %d were sent already",
                      common, self._sent)
        self.text, self._base = text, base
        self.steps += 1
        out = base[self._sent:]
        self._sent = max(self._sent, len(base))
        return out
