"""The embedded host of standalone mode: a GGUF model run by llama.cpp (llama-cpp-python).

It speaks the same generation-settings vocabulary as the web UI host (``max_new_tokens``,
``top_k``, ``repetition_penalty`` ...), so ``params.plan()`` serves both. The token loop is ours,
on llama.cpp's C sampler API: that gives exact token counts, logit bias, seeds, log-probabilities
and a stop check between every two tokens, without the layers of ``create_completion``.

Up to ``parallel`` requests generate at once, as sequences of one batch (llamacpp/batch.py). They
share the context's KV cells, so each request may use the whole context.

Before the model loads, probe.py decides whether llama.cpp may use its extra CPU buffer
types (weight repacking, AMX), which crash on some CPUs.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncGenerator

from ..base import ChatPrompt, Host, HostAbilities, Piece, Pieces, Prompt, TokenLogprob
from ..request import NO_CHAT_OPTIONS, ChatOptions, GenerationSettings
from . import outbox, probe, values
from .batch import Closed, Scheduler
from .context import PREFILL_CHUNK, Runtime, uses_flash_attn
from .draft import Drafter
from .sampling import SAMPLERS, Detokenizer, grammar_shape_ok
from .speculate import ModelDraft, Pace, PromptLookup, Tally
from .threads import Threads
from .vision import Media, Vision
from .work import Generation, NextToken, Scoring, Work

if TYPE_CHECKING:
    from PIL.Image import Image

log = logging.getLogger(__name__)

# Used when a GGUF carries no chat template (base models); documented in the README.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
FALLBACK_STOPS = ["\nUser:", "\nSystem:"]
# Characters of text tokenized in one call at most, where the text can be cut exactly (tokenize()).
TOKENIZE_PIECE = 4096
class LlamaCppHost(Host):
    owned_by = "llama.cpp"

    def __init__(self, model_path: str | os.PathLike, *, alias: str | None = None, n_ctx: int = 0,
                 n_threads: int | None = None, n_gpu_layers: int = 0, parallel: int = 1, repack: str = "auto",
                 flash_attn: str = "auto", mmproj: str | os.PathLike | None = None, speculation: str = "ngram",
                 draft_max: int | None = None, draft_model: str | os.PathLike | None = None, cache_type_v: str = "auto",
                 whole_drafts: bool = False, cache_ram_mb: int = 2048):
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"No GGUF file at {path}")
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        if speculation not in ("ngram", "off"):
            raise ValueError(f"speculation must be ngram or off, not {speculation!r}")
        self.buffers = probe.choose(path, repack, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        log.info("%s", self.buffers.line())
        # The model and its context: what the works of the batch are handed, freed by close().

        def choose_values(model: Any) -> str:
            chosen = values.choose(path, model, n_gpu_layers=n_gpu_layers, n_threads=n_threads)
            log.info("%s", chosen.line())
            return chosen.kind
        self.runtime = rt = Runtime(path, extra_buffers=self.buffers.extra_buffers, n_gpu_layers=n_gpu_layers,
                                    n_ctx=n_ctx, parallel=parallel, n_threads=n_threads, flash_attn=flash_attn,
                                    cache_type_v=cache_type_v, choose_values=choose_values)
        L, v = rt.L, rt.vocab
        self.path = path
        self.model_id = alias or path.name.removesuffix(".gguf")
        self.created = int(path.stat().st_mtime)
        self.metadata = rt.model.metadata()
        self.parallel = parallel
        self.speculation = speculation
        self.draft_max = draft_max   # (None: each kind of draft its own, speculate.Pace.MOST)
        self.tally = Tally()
        self.flash_attn = uses_flash_attn(flash_attn, parallel)
        self._grammar_ok: dict[str, bool] = {}
        fim = [L.llama_vocab_fim_pre(v), L.llama_vocab_fim_suf(v), L.llama_vocab_fim_mid(v)]
        self._fim = fim if all(t != L.LLAMA_TOKEN_NULL for t in fim) else None
        self._init_chat_template()
        self._init_specials()
        self.vision: Vision | None = None
        self.drafter: Drafter | None = None
        try:
            if mmproj is not None:
                self.vision = Vision(Path(mmproj), rt.model.model, n_threads=n_threads)
            if draft_model is not None and speculation != "off":
                self.drafter = Drafter(Path(draft_model), rt, slots=parallel,
                                       extra_buffers=self.buffers.extra_buffers, n_gpu_layers=n_gpu_layers,
                                       n_threads=n_threads, flash_attn=flash_attn, cache_type_v=rt.cache_type_v)
                self.speculation = "draft"
                log.info("speculation: drafts from %s", Path(draft_model).name)
        except BaseException:
            if self.vision is not None:
                self.vision.close()
            rt.close()
            raise
        self.abilities = HostAbilities(samplers=SAMPLERS, logprobs=True, logit_bias=True,
                                       fim=self._fim is not None, vocab_size=rt.n_vocab,
                                       grammar=True, lazy_grammar=True, parallel=parallel,
                                       vision=self.vision is not None)
        self.threads = Threads(self._set_threads, fixed=n_threads)
        self._sched = Scheduler(L, rt.ctx, slots=parallel, n_batch=L.llama_n_batch(rt.ctx),
                                cells=L.llama_n_ctx(rt.ctx), prefill_chunk=PREFILL_CHUNK,
                                before_step=self.threads.before_step, drafter=self.drafter,
                                # One sequence is the reproducible path (README): its steps must not
                                # depend on timing, and the pays-check's cut does.
                                whole_drafts=whole_drafts or parallel == 1,
                                stash_bytes=cache_ram_mb * 2 ** 20)

    def _set_threads(self, gen: int, batch: int) -> None:
        self.runtime.L.llama_set_n_threads(self.runtime.ctx, gen, batch)
        if self.drafter is not None:
            self.drafter.set_threads(gen, batch)

    # --- prompts ------------------------------------------------------------------------------
    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.runtime.L.llama_vocab_get_text(self.runtime.vocab, token).decode("utf-8", errors="replace")

    def _init_chat_template(self) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.metadata.get("tokenizer.chat_template")
        self.chat_template = template
        eos = self._token_text(self.runtime.L.llama_vocab_eos(self.runtime.vocab))
        bos = self._token_text(self.runtime.bos)
        self.has_chat_template = bool(template)
        self._formatter = Jinja2ChatFormatter(template or FALLBACK_TEMPLATE, eos_token=eos, bos_token=bos)
        self._template_stops = [eos] if template and eos else list(FALLBACK_STOPS)

    def context_length(self) -> int:
        """Tokens one request can see: the whole context (its sequences share the cells)."""
        return self.runtime.context_length

    def _init_specials(self) -> None:
        """What tokenize() needs to cut a long text where the cut changes no token: right after a
        special token, which llama.cpp's tokenizer treats as a fragment of its own. Tokens that
        strip the whitespace after them are left out (the strip would cross the cut)."""
        rt = self.runtime
        L, v = rt.L, rt.vocab
        texts, longest = set(), 1
        for t in range(rt.n_vocab):
            longest = max(longest, len(rt.piece(t, True)))
            attr = L.llama_vocab_get_attr(v, t)
            if attr & (L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_USER_DEFINED) and \
                    not attr & L.LLAMA_TOKEN_ATTR_RSTRIP:
                text = self._token_text(t)
                if text:
                    texts.add(text)
        self.max_token_bytes = longest
        # longest first, so a special that begins another is not cut in its middle
        self._specials = re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))) \
            if texts else None

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        # llama.cpp's tokenizer takes time quadratic in the number of special tokens in one call
        # (40,000 of them: seconds), so a long text goes in pieces cut after special tokens, which
        # gives the same tokens in linear time.
        rt = self.runtime
        tokens: list[int] = []
        for i, piece in enumerate(self._pieces(text)):
            tokens += rt.model.tokenize(piece.encode("utf-8"), add_bos=add_bos and rt.add_bos and i == 0,
                                        special=True)
        # A template that writes the BOS text itself must not end up with two of them.
        if len(tokens) > 1 and tokens[0] == rt.bos and tokens[1] == rt.bos:
            tokens = tokens[1:]
        return tokens

    def _pieces(self, text: str) -> list[str]:
        if len(text) <= TOKENIZE_PIECE or self._specials is None:
            return [text]
        pieces, start = [], 0
        while len(text) - start > TOKENIZE_PIECE:
            m = self._specials.search(text, start + TOKENIZE_PIECE)
            if m is None:
                break
            pieces.append(text[start:m.end()])
            start = m.end()
        pieces.append(text[start:])
        return pieces

    def prompt_tokens(self, text: str, images: list[Image]) -> list[int]:
        if images and self.vision is not None:
            return self.vision.tokens(text, images)
        return self.tokenize(text)

    def detokenize(self, tokens: list[int]) -> str:
        piece = self.runtime.piece
        # (an image's tokens, negative ids in a vision prompt, have no text)
        return b"".join(piece(t, False) for t in tokens if t >= 0).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: list[dict[str, Any]], options: ChatOptions = NO_CHAT_OPTIONS) -> ChatPrompt:
        try:
            # (llama_cpp types messages and tools as its TypedDicts; these are dicts of that shape)
            out = self._formatter(messages=messages, tools=options.tools)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - the template's own raise_exception(), or any jinja error
            from ...core.errors import InvalidRequestError
            raise InvalidRequestError(f"The model's chat template rejected these messages: {e}",
                                      param="messages") from None
        return ChatPrompt(out.prompt, list(self._template_stops))

    def document_start(self) -> list[int]:
        """What an empty prompt becomes: the start-of-text token, or the end-of-text token that
        separates documents in training (as OpenAI's <|endoftext|> does)."""
        rt = self.runtime
        return [rt.bos if rt.bos != rt.L.LLAMA_TOKEN_NULL else rt.L.llama_vocab_eos(rt.vocab)]

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        if self._fim is None:   # (abilities.fim is off: params.plan refuses suffix before this)
            raise NotImplementedError("the loaded model has no fill-in-the-middle tokens")
        pre, suf, mid = self._fim
        rt = self.runtime
        return ([rt.bos] if rt.add_bos else []) + [pre] + self.tokenize(prefix, add_bos=False) + \
            [suf] + self.tokenize(suffix, add_bos=False) + [mid]

    # --- generation ---------------------------------------------------------------------------
    def detokenizer(self, special: bool = False) -> "Detokenizer":
        return Detokenizer(lambda t: self.runtime.piece(t, special))

    def check_grammar(self, gbnf: str) -> bool:
        """Whether llama.cpp parses ``gbnf``. Asked while the request is prepared, so a grammar it
        rejects is the client's 400 rather than a failure in the middle of generating."""
        ok = self._grammar_ok.get(gbnf)
        if ok is None:
            ok = grammar_shape_ok(gbnf)
            if ok:
                try:
                    self.runtime.L.llama_sampler_free(self.runtime.grammar_sampler(gbnf))
                except ValueError:
                    ok = False
            if len(self._grammar_ok) >= 64:
                self._grammar_ok.clear()
            self._grammar_ok[gbnf] = ok
        return ok

    def generate(self, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event) -> Pieces:
        """Runs as one sequence of the batch; this generator only hands on what the scheduler's
        thread produces for it."""
        if settings.max_new_tokens <= 0:
            yield Piece("", tokens=0, finish_reason="length")
            return
        yield from outbox.pieces(self._start(prompt, settings, stop_event), self._sched.wake)

    def stream(self, prompt: Prompt, settings: GenerationSettings,
               stop_event: threading.Event) -> AsyncGenerator[Piece, None] | None:
        if settings.max_new_tokens <= 0:
            return None   # (generate answers it at once)
        return outbox.apieces(lambda: self._start(prompt, settings, stop_event), self._sched.wake)

    def _start(self, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event) -> Generation:
        """Submits the generation as a sequence of the batch."""
        room = self.context_length() - len(prompt.tokens)
        if not prompt.tokens:
            # sampling without any evaluated token would abort inside llama.cpp
            raise ValueError("an empty prompt reached the model")
        if room <= 0:
            raise ValueError(f"a prompt of {len(prompt.tokens)} tokens reached a context of {self.context_length()}")
        # The budget never outgrows the context.
        s = settings.replace(max_new_tokens=min(settings.max_new_tokens, room))
        media = self._media(prompt)
        try:
            lookup = self._speculator(media)
            work = Generation(self.runtime, prompt.tokens, s, stop_event, lookup)
        except BaseException:
            if media is not None:
                media.close()
            raise
        work.media = media
        self._submit(work)
        return work

    def _speculator(self, media: Media | None) -> Pace | None:
        if self.speculation == "draft":
            # (the draft model reads no image: a prompt with images drafts by lookup instead)
            return ModelDraft(self.draft_max, self.tally) if media is None else PromptLookup(self.draft_max, self.tally)
        return PromptLookup(self.draft_max, self.tally) if self.speculation == "ngram" else None

    def _media(self, prompt: Prompt) -> Media | None:
        """A vision prompt's chunks, for the batch to read its images from (the prompt's tokens
        were made from the same text and images, so they line up)."""
        if not prompt.images or self.vision is None:
            return None
        media = self.vision.media(prompt.text, prompt.images)
        if media.tokens != list(prompt.tokens) or prompt.tokens[-1] < 0:
            media.close()
            raise ValueError("a prompt with images reached the model changed from what was tokenized")
        return media

    def _submit(self, work: Work) -> None:
        try:
            self._sched.submit(work)
        except Closed:
            work.retire()
            from ...core.errors import ServiceUnavailableError
            raise ServiceUnavailableError("The model was closed while this request waited; send it again.",
                                          code="model_changed") from None

    def prompt_logprobs(self, tokens: list[int], top: int) -> list[TokenLogprob]:
        """Log-probabilities of the prompt's tokens, each given the ones before it (for echo).

        A leading BOS token has no text and is left out. Every other token gets a real score:
        the first one is scored after the start-of-text token (BOS, or the end-of-text token that
        separates documents in training), as a new document would begin. The pass runs as one
        sequence of the batch.
        """
        if tokens and tokens[0] == self.runtime.bos:
            context, scored = tokens, tokens[1:]
        else:
            context, scored = self.document_start() + tokens, tokens
        if not scored:
            return []
        work = Scoring(self.runtime, context, top)
        self._submit(work)
        work.wait()
        assert len(work.scores) == len(scored)
        return work.scores

    def next_token_probabilities(self, prompt: str, settings: GenerationSettings, use_samplers: bool,
                                 top: int) -> dict[str, float]:
        """The model's own distribution after the prompt (no sampler touches it)."""
        if use_samplers:
            from ...core.errors import InvalidRequestError
            raise InvalidRequestError("use_samplers is not supported by the embedded host: it reports the model's "
                                      "own probabilities only. Remove use_samplers.", param="use_samplers")
        work = NextToken(self.runtime, self.tokenize(prompt) or self.document_start(), top)
        self._submit(work)   # one sequence of the batch, as a scoring pass is
        work.wait()
        return {_escaped(self.runtime.piece(t, True).decode("utf-8", errors="replace")): p for t, p in work.best}

    def stop_all(self) -> None:
        self._sched.halt_all()

    def idle(self) -> bool:
        """Nothing runs or waits in the batch."""
        return self._sched.idle()

    def batch_stats(self) -> dict[str, Any]:
        """Sequences running and waiting, and what the batch has done so far."""
        return self._sched.describe()

    def close(self) -> None:
        """Lets what runs finish (a model change waits for it, as it waited for its turn before),
        then frees the context and the model."""
        self._sched.close()
        if self.vision is not None:
            self.vision.close()
        if self.drafter is not None:
            self.drafter.close()
        self.runtime.close()

    def describe(self) -> dict[str, Any]:
        # The web UI's shape (model_name, lora_names, loader), plus what a client may want to know.
        # The file's name, not its path: the folder layout of the machine is not the client's business.
        return {"model_name": self.model_id, "lora_names": [], "loader": "llama.cpp", "file": self.path.name,
                "n_ctx": self.context_length(), "chat_template": self.has_chat_template, "parallel": self.parallel,
                "extra_cpu_buffers": self.buffers.extra_buffers, "flash_attn": self.flash_attn,
                "cache_type_v": self.runtime.cache_type_v,
                "mmproj": self.vision.path.name if self.vision is not None else None,
                "batch": self.batch_stats(),
                "speculation": {"mode": self.speculation,
                                "draft_max": self.draft_max or (ModelDraft if self.drafter else PromptLookup).MOST,
                                "draft_model": self.drafter.path.name if self.drafter is not None else None,
                                "recent": self.tally.recent()},
                "threads": {"generation": self.threads.gen, "batch": self.threads.batch,
                            "adaptive": self.threads.adaptive}}

    def sequences(self) -> dict[str, int]:
        counts = self._sched.counts()
        return {"running": counts["running"], "waiting": counts["waiting"], "slots": counts["slots"]}

    def kv_cells(self) -> dict[str, int]:
        counts = self._sched.counts()
        return {"used": counts["cells_used"], "total": counts["cells_total"]}


def _escaped(token: str) -> str:
    """Control characters written as escapes, as the web UI's /v1/internal/logits shows them."""
    return "".join(repr(c)[1:-1] if ord(c) <= 0x1F or 0x7F <= ord(c) <= 0x9F else c for c in token)
