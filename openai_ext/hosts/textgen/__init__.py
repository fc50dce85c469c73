"""The web UI host: generation through the ``modules`` package of the web UI that loads us.

Everything goes through the host: its model and tokenizer, its context length
(``truncation_length``), its ``generate_reply`` (which takes ``shared.generation_lock`` itself),
its settings dict as the base of every request's state, and its chat prompt builder with the
model's instruction template. Stop strings are the exception: the server applies them itself
(see ``TextgenHost.generate``).

Its samplers have no typed options model, unlike the other hosts': they are the web UI's own
settings, keys of its state dict whose set depends on the loaded model's loader and on the web
UI's version (``_samplers``). The values are checked against ``base.HOST_SAMPLERS``' types by
params.plan and copied into that state by name (state.py); the web UI reads them itself.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import threading
import weakref
from types import SimpleNamespace
from typing import Any, Iterator

from ...core.errors import InvalidRequestError, ServiceUnavailableError
from ..base import HOST_SAMPLERS, ChatPrompt, Host, HostAbilities, Piece, Pieces, Prompt, TokenLogprob
from ..request import NO_CHAT_OPTIONS, ChatOptions, GenerationSettings
from . import images as textgen_images
from . import scores
from . import server as model_server
from .chat import messages_to_history, resolve_chat, resolve_preset
from .replies import Follower, Turns, chat_reply, host_failures
from .state import request_state

log = logging.getLogger(__name__)

# The web UI truncates chat history to fit truncation_length; the server checks the length
# itself (and answers context_length_exceeded), so the prompt builder is told not to cut.
_NO_TRUNCATION = 10 ** 9


def import_host_modules() -> SimpleNamespace:
    names = ("shared", "text_generation", "chat", "models", "utils", "LoRA", "loaders", "models_settings")
    return SimpleNamespace(**{n: importlib.import_module(f"modules.{n}") for n in names})


@functools.lru_cache(maxsize=16)
def _abilities(loader: str | None, samplers: frozenset[str], parallel: int, vision: bool) -> HostAbilities:
    return HostAbilities(
        samplers=samplers,
        parallel=parallel,
        # llama.cpp and ExLlamaV3 report them (n_probs); the Transformers-based loaders run a
        # logits processor. TensorRT-LLM has neither.
        logprobs=loader in scores.NATIVE + scores.HF,
        # echo: llama.cpp scores a prompt (prompt_logprobs), the others by a forward pass
        prompt_logprobs=loader == "llama.cpp" or loader in scores.HF,
        # The host forwards logit_bias to llama.cpp; its other loaders would ignore it.
        logit_bias=loader == "llama.cpp",
        # These loaders apply the host's grammar_string; none has a lazy (triggered) grammar.
        grammar=loader in ("llama.cpp", "Transformers", "ExLlamav3_HF"),
        web_ui=True,
        # the web UI loaded a vision model (llama.cpp with --mmproj, ExLlamaV3): models.load_model
        # sets shared.is_multimodal from the model's is_multimodal()
        vision=vision,
    )


# Whether each llama.cpp model's server scores prompts (llama-server's prompt_logprobs, which
# upstream llama.cpp does not have): asked once per loaded model.
_SCORES_PROMPTS: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
NO_PROMPT_SCORES = ("The web UI's llama.cpp loader cannot score a prompt: its llama-server has no prompt_logprobs, "
                    "so echo cannot return the prompt's log-probabilities. Remove echo or logprobs, or load the "
                    "model with the Transformers loader.")


# The model classes whose generations the host runs side by side (text_generation.generate_reply).
PARALLEL_MODELS = ("Exllamav3Model", "LlamaServer", "TensorRTLLMModel")


class TextgenHost(Host):
    owned_by = "local"

    def __init__(self, modules: SimpleNamespace | None = None):
        self.m = modules or import_host_modules()
        self._wake_lock = threading.Lock()
        self._turns = Turns()

    @property
    def abilities(self) -> HostAbilities:  # type: ignore[override]  # (read per request, never set)
        """Read for each request: the user may load another model, with another loader, in the
        web UI while the server runs."""
        loader = getattr(getattr(self.m.shared, "args", None), "loader", None)
        vision = bool(getattr(self.m.shared, "is_multimodal", False)) and self.m.shared.model is not None
        return _abilities(loader, self._samplers(loader), self._slots(), vision)

    def _slots(self) -> int:
        """Generations the host runs at once. Its generate_reply skips the generation lock for a
        request with a stop event on the models that serve parallel slots (llama.cpp with
        --parallel N above 1, ExLlamaV3, TensorRT-LLM); there the API runs up to --parallel of
        them at once (llama.cpp divides its context among them). Elsewhere the lock serialises
        every generation, so one at a time."""
        name = type(self.m.shared.model).__name__
        slots = int(getattr(getattr(self.m.shared, "args", None), "parallel", 1) or 1)
        if name not in PARALLEL_MODELS or (name == "LlamaServer" and slots <= 1):
            return 1
        return max(1, slots)

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
    def chat_template(self) -> str | None:  # type: ignore[override]  # (the model the web UI has now)
        return self.m.shared.settings.get("instruction_template_str")

    @property
    def model_id(self) -> str:  # type: ignore[override]  # (the model the web UI has now)
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
            model_server.check(self.m.shared.model)
            return
        if self._idle_unloaded():
            with self._wake_lock:   # one load, however many requests arrive at once
                if self.m.shared.model is None:
                    log.info("loading %s again (the web UI unloaded it while idle)", self.model_id)
                    self.m.models.load_model_if_idle_unloaded()
        if self.m.shared.model is None:
            raise ServiceUnavailableError("No model is loaded. Load one in the web UI, or with POST "
                                          "/v1/internal/model/load.", code="model_not_loaded")
        model_server.check(self.m.shared.model)

    def context_length(self) -> int:
        return int(self.m.shared.settings["truncation_length"])

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        self._require_model()
        # add_special_tokens too: on Transformers, add_bos_token=False alone still adds BOS
        with model_server.guarded(self.m.shared.model):
            ids = self.m.text_generation.encode(text, add_special_tokens=add_bos, add_bos_token=add_bos)
        # encode() gives a (1, n) numpy array or torch tensor, depending on the loader
        return [int(t) for t in ids[0].tolist()]

    def detokenize(self, tokens: list[int]) -> str:
        # Special tokens are kept: a prompt rebuilt from its tokens (a cut prompt, or token-id
        # input) must keep its chat template's markers.
        self._require_model()
        with model_server.guarded(self.m.shared.model):
            return self.m.text_generation.decode([int(t) for t in tokens], skip_special_tokens=False)

    def check_settings(self, settings: GenerationSettings) -> None:
        if settings.preset:
            resolve_preset(self.m, settings.preset)

    def chat_prompt(self, messages: list[dict[str, Any]], options: ChatOptions = NO_CHAT_OPTIONS) -> ChatPrompt:
        self._require_model()   # the prompt builder may count tokens
        user_input, system, history = messages_to_history(messages)
        state = request_state(self.m, options=options)
        state.update(history=history, custom_system_message=system, truncation_length=_NO_TRUNCATION,
                     max_new_tokens=0)
        state.update(resolve_chat(self.m, options))
        try:
            # (the web UI's prompt builder counts tokens with llama-server's /tokenize)
            with model_server.guarded(self.m.shared.model):
                text = self.m.chat.generate_chat_prompt(user_input, state, _continue=options.continue_)
        except ServiceUnavailableError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever the web UI's template code raises, told to the client
            raise InvalidRequestError(f"The chat template could not render these messages ({e}).",
                                      param="messages") from None
        # the web UI's chatbot_wrapper strips the start of a chat-mode reply (not a continued one)
        trim = state["mode"] in ("chat", "chat-instruct") and not options.continue_
        return ChatPrompt(text, list(self.m.chat.get_stopping_strings(state)), trim)

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        """The web UI's own splitter (modules/reasoning.py), which knows its models' formats."""
        try:
            return importlib.import_module("modules.reasoning").extract_reasoning(text)
        except ImportError:
            return super().split_reasoning(text)

    def generate(self, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event) -> Pieces:
        """The host's reply as pieces, each with the tokens it took, the last with the finish reason.

        The host is given no stop strings: the server applies them to this text (holding back
        what could still become one) and stops the host through ``stop_event``. Given stop
        strings, the host would cut a partial one off the end of its final text, and that text
        would no longer show how much was generated. With log-probabilities, each piece is one
        token with its entry (see scores.py).
        """
        self._require_model()
        # The llama.cpp and ExLlamaV3 loaders keep the log-probabilities of "the" generation in
        # one attribute of the model: a generation that reads them runs alone.
        alone = settings.logprobs is not None and self._slots() > 1
        with self._turns.take(alone, stop_event) as turn:
            if turn:
                pieces = self._generate(prompt, settings, stop_event)
                if prompt.trim_start:
                    pieces = chat_reply(pieces)
                yield from pieces

    def _generate(self, prompt: Prompt, settings: GenerationSettings,
                  stop_event: threading.Event) -> Pieces:
        state = request_state(self.m, settings)
        # stream: without it the host generates the whole reply before it yields anything, and
        # the server could not stop it at a stop string.
        state.update(stop_event=stop_event, custom_stopping_strings=[], stream=True)
        if prompt.images:
            # as the web UI's API hands a request's images to its loader: PIL images in raw_images,
            # one per <__media__> placeholder of the prompt (its loaders read image_attachments
            # first, so none may be left in the state)
            state.pop("image_attachments", None)
            state["raw_images"] = list(prompt.images)
        source, aligner = self._scores(state, settings.logprobs)
        follow = Follower()
        reported = 0
        # guarded: the web UI catches a dead server's error while generating, but then counts the
        # reply's tokens with the same dead server (generate_reply_custom's finally), which raises
        with host_failures() as failures, model_server.guarded(self.m.shared.model, " while generating this reply"):
            replies = self.m.text_generation.generate_reply(prompt.text, state, stopping_strings=[], is_chat=False)
            # closing() matters: the host releases its generation lock in the generator's finally.
            with contextlib.closing(replies):
                for text in replies:
                    new = follow.follow(text)
                    if aligner is None:
                        if new:
                            yield Piece(new, tokens=follow.steps - reported)
                            reported = follow.steps
                    else:
                        aligner.add_text(new)
                        aligner.add(source.new())
                        for piece in aligner.pieces():
                            reported += piece.tokens or 0
                            yield piece
                    if stop_event.is_set():
                        return
        if failures.error is not None or not follow.text:   # (an empty reply: the server may have died)
            model_server.check(self.m.shared.model, " while generating this reply")
            raise RuntimeError(f"the web UI's generation failed: {failures.error}") from failures.error
        tail = follow.finish()
        limit = settings.max_new_tokens
        if aligner is not None:
            aligner.add_text(tail)
            yield from self._last_scored(source, aligner)
            reported = aligner.tokens
            tail = aligner.text
        produced = max(self._produced(follow), aligner.tokens if aligner is not None else 0)
        # The host stopped by itself: at an end-of-text token, or at max_new_tokens (then it
        # generated exactly that many).
        finish = "length" if produced >= limit > 0 else "stop"
        total = limit if finish == "length" else produced
        yield Piece(tail, tokens=max(0, total - reported), finish_reason=finish)

    def _scores(self, state: dict[str, Any], wanted: Any) -> tuple[Any, "scores.Aligner | None"]:
        """Asks the host's loader for log-probabilities, as the web UI's own API does."""
        if wanted is None:
            return None, None
        top = int(wanted)
        loader = getattr(self.m.shared.args, "loader", None)
        state["logprobs"] = max(top, 1)   # the loader asks for none at 0
        if loader in scores.NATIVE:
            return scores.NativeEntries(self.m.shared.model, top), scores.Aligner()
        recorder = scores.Recorder(top, self._decode_output, self.m.shared.tokenizer)
        state["logits_processor"] = recorder
        return recorder, scores.Aligner()

    def _last_scored(self, source: Any, aligner: "scores.Aligner") -> Iterator[Piece]:
        """The entries still to come once the host has stopped, and the pieces they complete."""
        aligner.add(source.new())
        if isinstance(source, scores.Recorder):
            # the last token sampled is seen by no later call: its text is what is left
            rest = aligner.text[len("".join(s.text for s in aligner.queue)):]
            aligner.add(source.finish(rest, functools.partial(self.tokenize, add_bos=False)))
        yield from aligner.pieces(final=True)

    def _decode_output(self, ids: list[int]) -> str:
        return self.m.text_generation.decode([int(t) for t in ids], skip_special_tokens=True)

    def check_prompt_scoring(self) -> None:
        """The llama.cpp loader's server scores prompts only if it was built with prompt_logprobs;
        without, the loader answers no entries at all. Asked once per loaded model, with two tokens."""
        if getattr(self.m.shared.args, "loader", None) != "llama.cpp":
            return
        self._require_model()
        model = self.m.shared.model
        known = _SCORES_PROMPTS.get(model)
        if known is None:
            ids = (self.document_start() or self.tokenize(".", add_bos=False)[:1]) + self.tokenize(".", add_bos=False)
            with model_server.guarded(model):
                known = bool(scores.native_prompt_scores(model, ids, 1))
            _SCORES_PROMPTS[model] = known
        if not known:
            raise InvalidRequestError(NO_PROMPT_SCORES, param="echo")

    def prompt_logprobs(self, tokens: list[int], top: int) -> list[TokenLogprob]:
        """Scores of the prompt's tokens (a leading start token apart), for echo. A prompt that
        does not begin with the start token gets it in front, so its first token is scored too."""
        self._require_model()
        start = self.document_start()
        visible = tokens[1:] if start and tokens[:1] == start else tokens
        ids = start + visible
        if len(ids) == len(visible):
            raise InvalidRequestError("The loaded model has no start-of-text token, so the first token of the "
                                      "prompt cannot be scored; remove echo or logprobs.", param="echo")
        loader = getattr(self.m.shared.args, "loader", None)
        model = self.m.shared.model
        if loader == "llama.cpp":
            scored = scores.native_prompt_scores(model, ids, top)
            if len(scored) < len(visible):   # (a server without prompt_logprobs answers none)
                _SCORES_PROMPTS[model] = False
                raise InvalidRequestError(NO_PROMPT_SCORES, param="echo")
        else:
            scored = scores.hf_prompt_scores(model, ids, top, self._decode_output, self.m.shared.tokenizer)
        entries = [s.entry for s in scored[-len(visible):] if s.entry is not None] if visible else []
        if len(entries) != len(visible):
            raise RuntimeError("the web UI's loader left some of the prompt's tokens unscored")
        return entries

    def document_start(self) -> list[int]:
        """The start-of-text token: BOS, as the tokenizer adds it, or the one the model names
        (the llama.cpp loader's bos_token, a Transformers tokenizer's bos or eos token)."""
        start = self.tokenize("", add_bos=True)
        if start:
            return start[:1]
        model, tokenizer = self.m.shared.model, self.m.shared.tokenizer
        for token_id in (getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
            if isinstance(token_id, int):
                return [token_id]
        name = getattr(model, "bos_token", None)
        if isinstance(name, str) and name:
            ids = self.tokenize(name, add_bos=False)
            if len(ids) == 1:
                return ids
        return []

    def _produced(self, follow: Follower) -> int:
        """How many tokens the host generated. It reports text, not tokens, so this is the
        larger of two lower bounds: the yields that brought new text (one token at least each),
        and the token count of the whole untrimmed text (a tokenizer may merge what the model
        generated as several tokens)."""
        counted = len(self.tokenize(follow.text, add_bos=False)) if follow.text else 0
        return max(follow.steps, counted)

    def next_token_probabilities(self, prompt: str, settings: GenerationSettings, use_samplers: bool,
                                 top: int) -> dict[str, float]:
        """The web UI's own get_next_logits, as its /v1/internal/logits calls it: it takes the
        generation lock itself (without samplers) or generates one token (with them)."""
        self._require_model()
        state = request_state(self.m, settings)
        state.update(stream=True, max_new_tokens=1, auto_max_new_tokens=False, custom_stopping_strings=[])
        with host_failures() as failures:
            result = importlib.import_module("modules.logits").get_next_logits(
                prompt, state, use_samplers, "", top_logits=top, return_dict=True)
        if not isinstance(result, dict):
            raise RuntimeError(f"the web UI could not compute the next token's logits ({failures.error or result})")
        return {str(k): float(v) for k, v in result.items()}

    def stop_all(self) -> None:
        self.m.text_generation.stop_everything_event()

    def image_model(self) -> textgen_images.WebUiImages | None:
        return textgen_images.loaded(self.m.shared)

    def unavailable(self) -> ServiceUnavailableError | None:
        status = model_server.exit_status(self.m.shared.model)
        return None if status is None else model_server.stopped_error(status)

    def describe(self) -> dict[str, Any]:
        shared = self.m.shared
        return {"model_name": self.model_id, "lora_names": list(getattr(shared, "lora_names", []) or []),
                "loader": getattr(getattr(shared, "args", None), "loader", None)}
