"""The embedded host of standalone mode: a GGUF model run by llama.cpp (llama-cpp-python).

It speaks the same generation-settings vocabulary as the web UI host (``max_new_tokens``,
``top_k``, ``repetition_penalty`` ...), so ``params.plan()`` serves both. The token loop is ours,
on llama.cpp's C sampler API: that gives exact token counts, logit bias, seeds, log-probabilities
and a stop check between every two tokens, without the layers of ``create_completion``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .base import ChatPrompt, Host, HostAbilities, Piece, Prompt, TokenLogprob
from .llamacpp_sampling import NEUTRAL, SAMPLERS, Constrained, Detokenizer, sampler_chain

log = logging.getLogger(__name__)

# Used when a GGUF carries no chat template (base models); documented in the README.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
FALLBACK_STOPS = ["\nUser:", "\nSystem:"]
# Characters of text tokenized in one call at most, where the text can be cut exactly (tokenize()).
TOKENIZE_PIECE = 4096

def _lazy_llama():
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SystemExit("Standalone mode needs llama-cpp-python: pip install -r requirements.txt") from e
    return llama_cpp


class LlamaCppHost(Host):
    owned_by = "llama.cpp"

    def __init__(self, model_path: str | os.PathLike, *, alias: str | None = None, n_ctx: int = 0,
                 n_threads: int | None = None, n_gpu_layers: int = 0):
        L = _lazy_llama()
        self._L = L
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"No GGUF file at {path}")
        kwargs: dict[str, Any] = {"n_ctx": n_ctx, "n_gpu_layers": n_gpu_layers, "verbose": False}
        if n_threads:
            kwargs["n_threads"] = n_threads
        self.llm = L.Llama(str(path), **kwargs)
        self.path = path
        self.model_id = alias or path.name.removesuffix(".gguf")
        self.created = int(path.stat().st_mtime)
        self._vocab = L.llama_model_get_vocab(self.llm.model)
        self._n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self._ctx = self.llm.ctx
        self._lock = threading.Lock()
        self._stop_all = threading.Event()
        self._piece_cache: dict[tuple[int, bool], bytes] = {}
        self._grammar_ok: dict[str, bool] = {}
        self._add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
        self._bos = L.llama_vocab_bos(self._vocab)
        self._eog = np.array([L.llama_vocab_is_eog(self._vocab, t) for t in range(self._n_vocab)], dtype=bool)
        v = self._vocab
        fim = [L.llama_vocab_fim_pre(v), L.llama_vocab_fim_suf(v), L.llama_vocab_fim_mid(v)]
        self._fim = fim if all(t != L.LLAMA_TOKEN_NULL for t in fim) else None
        self._init_chat_template()
        self._init_specials()
        self.abilities = HostAbilities(samplers=SAMPLERS, logprobs=True, logit_bias=True,
                                       fim=self._fim is not None, vocab_size=self._n_vocab,
                                       grammar=True, lazy_grammar=True)

    # --- prompts ------------------------------------------------------------------------------
    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._L.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    def _init_chat_template(self) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.llm.metadata.get("tokenizer.chat_template")
        self.chat_template = template
        eos = self._token_text(self._L.llama_vocab_eos(self._vocab))
        bos = self._token_text(self._bos)
        self.has_chat_template = bool(template)
        self._formatter = Jinja2ChatFormatter(template or FALLBACK_TEMPLATE, eos_token=eos, bos_token=bos)
        self._template_stops = [eos] if template and eos else list(FALLBACK_STOPS)

    def context_length(self) -> int:
        return self.llm.n_ctx()

    def _init_specials(self) -> None:
        """What tokenize() needs to cut a long text where the cut changes no token: right after a
        special token, which llama.cpp's tokenizer treats as a fragment of its own. Tokens that
        strip the whitespace after them are left out (the strip would cross the cut)."""
        L, v = self._L, self._vocab
        texts, longest = set(), 1
        for t in range(self._n_vocab):
            longest = max(longest, len(self._piece(t, True)))
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
        tokens: list[int] = []
        for i, piece in enumerate(self._pieces(text)):
            tokens += self.llm.tokenize(piece.encode("utf-8"), add_bos=add_bos and self._add_bos and i == 0,
                                        special=True)
        # A template that writes the BOS text itself must not end up with two of them.
        if len(tokens) > 1 and tokens[0] == self._bos and tokens[1] == self._bos:
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

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self._piece(t, False) for t in tokens).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: list[dict[str, Any]], settings: dict[str, Any]) -> ChatPrompt:
        try:
            out = self._formatter(messages=messages, tools=settings.get("tools"))
        except Exception as e:  # the template's own raise_exception(), or a jinja error
            from ..core.errors import InvalidRequestError
            raise InvalidRequestError(f"The model's chat template rejected these messages: {e}",
                                      param="messages") from None
        return ChatPrompt(out.prompt, list(self._template_stops))

    def document_start(self) -> list[int]:
        """What an empty prompt becomes: the start-of-text token, or the end-of-text token that
        separates documents in training (as OpenAI's <|endoftext|> does)."""
        L = self._L
        return [self._bos if self._bos != L.LLAMA_TOKEN_NULL else L.llama_vocab_eos(self._vocab)]

    def fim_prompt(self, prefix: str, suffix: str) -> list[int]:
        pre, suf, mid = self._fim
        return ([self._bos] if self._add_bos else []) + [pre] + self.tokenize(prefix, add_bos=False) + \
            [suf] + self.tokenize(suffix, add_bos=False) + [mid]

    # --- generation ---------------------------------------------------------------------------
    def _piece(self, token: int, special: bool) -> bytes:
        key = (token, special)
        piece = self._piece_cache.get(key)
        if piece is None:
            buf = ctypes.create_string_buffer(256)
            n = self._L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
            piece = buf.raw[:max(n, 0)]
            self._piece_cache[key] = piece
        return piece

    def detokenizer(self, special: bool = False) -> "Detokenizer":
        return Detokenizer(lambda t: self._piece(t, special))

    def _bias(self, s: dict[str, Any]) -> dict[int, float]:
        """Token id -> logit bias, from logit_bias, custom_token_bans and ban_eos_token."""
        bias: dict[int, float] = {int(k): float(v) for k, v in (s.get("logit_bias") or {}).items()}
        for tok in filter(None, (t.strip() for t in str(s.get("custom_token_bans") or "").split(","))):
            bias[int(tok)] = float("-inf")
        if s.get("ban_eos_token"):
            for tok in np.flatnonzero(self._eog):
                bias[int(tok)] = float("-inf")
        return {tok: float("-inf") if b <= -100 else b for tok, b in bias.items()}

    def _sampler(self, s: dict[str, Any], *, bias: bool = True):
        """llama.cpp's sampler chain for these settings, with the bias unless ``bias`` is false."""
        return sampler_chain(self._L, self._vocab, self._n_vocab, self.context_length(), s,
                             self._bias(s) if bias else {})

    def _grammar_sampler(self, gbnf: str):
        smpl = self._L.llama_sampler_init_grammar(self._vocab, gbnf.encode(), b"root")
        if not smpl:
            raise ValueError("llama.cpp could not parse the grammar built for this request")
        return smpl

    def check_grammar(self, gbnf: str) -> bool:
        """Whether llama.cpp parses ``gbnf``. Asked while the request is prepared, so a grammar it
        rejects is the client's 400 rather than a failure in the middle of generating."""
        ok = self._grammar_ok.get(gbnf)
        if ok is None:
            smpl = self._L.llama_sampler_init_grammar(self._vocab, gbnf.encode(), b"root")
            ok = bool(smpl)
            if smpl:
                self._L.llama_sampler_free(smpl)
            if len(self._grammar_ok) >= 64:
                self._grammar_ok.clear()
            self._grammar_ok[gbnf] = ok
        return ok

    def _logprob(self, output: int, token: int, top: int) -> TokenLogprob:
        """The log-probability of ``token`` under the logits of decoder output ``output``,
        with the ``top`` most likely alternatives."""
        logits = np.ctypeslib.as_array(self._L.llama_get_logits_ith(self._ctx, output), shape=(self._n_vocab,))
        m = float(logits.max())
        logz = m + float(np.log(np.exp(logits - m).sum()))

        def item(t: int) -> tuple[str, float, list[int]]:
            raw = self._piece(t, True)
            return raw.decode("utf-8", errors="replace"), float(logits[t]) - logz, list(raw)

        entry = TokenLogprob(*item(token))
        if top > 0:
            best = np.argpartition(-logits, top)[:top]
            entry.top = [item(int(t)) for t in best[np.argsort(-logits[best])]]
        return entry

    def _prepare(self, tokens: list[int]) -> None:
        """Evaluates the prompt, reusing the longest prefix already in the KV cache."""
        if not tokens:
            # sampling without any evaluated token would abort inside llama.cpp
            raise ValueError("an empty prompt reached the model")
        llm = self.llm
        cached = llm.input_ids[:llm.n_tokens]
        n = 0
        limit = min(len(cached), len(tokens) - 1)  # the last prompt token is always decoded, for its logits
        while n < limit and cached[n] == tokens[n]:
            n += 1
        if n == 0 or not self._L.llama_memory_seq_rm(self._L.llama_get_memory(self._ctx), -1, n, -1):
            llm.reset()
            n = 0
        else:
            llm.n_tokens = n
        llm.eval(tokens[n:])

    def generate(self, prompt: Prompt, settings: dict[str, Any], stop_event: threading.Event) -> Iterator[Piece]:
        s = {**NEUTRAL, **settings}
        max_new = int(s["max_new_tokens"])
        top = s.get("logprobs")
        special = not s["skip_special_tokens"]
        with self._lock:
            self._stop_all.clear()
            if max_new <= 0:
                yield Piece("", tokens=0, finish_reason="length")
                return
            constrained = bool(s.get("grammar_string"))
            sampler = self._sampler(s, bias=not constrained)
            text_of = self.detokenizer(special)
            guide = Constrained(self, s, sampler, special) if constrained else None
            try:
                self._prepare(prompt.tokens)
                produced = 0
                while True:
                    if stop_event.is_set() or self._stop_all.is_set():
                        return
                    token = self._L.llama_sampler_sample(sampler, self._ctx, -1) if guide is None else guide.sample()
                    if token is None or self._eog[token]:
                        # (None: the grammar allows no token that the request did not ban)
                        yield Piece(text_of.flush(), tokens=0, finish_reason="stop")
                        return
                    text = text_of.push(token)
                    tokens = [token]
                    cut = guide.watch(token, text) if guide is not None else None
                    if cut is not None:  # the trigger ended inside this token: it is replaced
                        text, tokens = cut
                        text_of.flush()
                    for i, tok in enumerate(tokens):
                        lp = self._logprob(-1, tok, top) if top is not None else None
                        produced += 1
                        part = text if i == 0 else ""
                        if produced >= max_new:
                            yield Piece(part + text_of.flush(), logprob=lp, finish_reason="length")
                            return
                        yield Piece(part, logprob=lp)
                        self.llm.eval([tok])
            finally:
                self._L.llama_sampler_free(sampler)
                if guide is not None:
                    guide.close()

    def prompt_logprobs(self, tokens: list[int], top: int) -> list[TokenLogprob]:
        """Log-probabilities of the prompt's tokens, each given the ones before it (for echo).

        A leading BOS token has no text and is left out. Every other token gets a real score:
        the first one is scored after the start-of-text token (BOS, or the end-of-text token that
        separates documents in training), as a new document would begin.
        """
        L = self._L
        if tokens and tokens[0] == self._bos:
            context, scored = tokens, tokens[1:]
        else:
            context, scored = self.document_start() + tokens, tokens
        out: list[TokenLogprob] = []
        with self._lock:
            L.llama_memory_seq_rm(L.llama_get_memory(self._ctx), -1, 0, -1)
            self.llm.reset()
            n_batch = self.llm.n_batch
            batch = L.llama_batch_init(n_batch, 0, 1)
            try:
                for start_at in range(0, len(context) - 1, n_batch):
                    chunk = context[start_at:start_at + n_batch]
                    batch.n_tokens = len(chunk)
                    for i, tok in enumerate(chunk):
                        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, start_at + i, 1, True
                        batch.seq_id[i][0] = 0
                    if L.llama_decode(self._ctx, batch) != 0:
                        raise RuntimeError("llama_decode failed while scoring the prompt")
                    for i in range(len(chunk)):
                        nxt = start_at + i + 1
                        if nxt < len(context):
                            out.append(self._logprob(i, context[nxt], top))
            finally:
                L.llama_batch_free(batch)
                # Nothing of this scoring pass is kept as a prompt cache.
                L.llama_memory_seq_rm(L.llama_get_memory(self._ctx), -1, 0, -1)
                self.llm.reset()
        assert len(out) == len(scored)
        return out

    def next_token_probabilities(self, prompt: str, settings: dict[str, Any], use_samplers: bool,
                                 top: int) -> dict[str, float]:
        """The model's own distribution after the prompt (no sampler touches it)."""
        if use_samplers:
            from ..core.errors import InvalidRequestError
            raise InvalidRequestError("use_samplers is not supported by the embedded host: it reports the model's "
                                      "own probabilities only. Remove use_samplers.", param="use_samplers")
        tokens = self.tokenize(prompt) or self.document_start()
        with self._lock:
            self._prepare(tokens)
            logits = np.ctypeslib.as_array(self._L.llama_get_logits_ith(self._ctx, -1), shape=(self._n_vocab,))
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            best = np.argsort(-probs)[:top]
            return {_escaped(self._piece(int(t), True).decode("utf-8", errors="replace")): float(probs[t])
                    for t in best}

    def stop_all(self) -> None:
        self._stop_all.set()

    def close(self) -> None:
        self.llm.close()

    def describe(self) -> dict[str, Any]:
        # The web UI's shape (model_name, lora_names, loader), plus what a client may want to know.
        # The file's name, not its path: the folder layout of the machine is not the client's business.
        return {"model_name": self.model_id, "lora_names": [], "loader": "llama.cpp", "file": self.path.name,
                "n_ctx": self.context_length(), "chat_template": self.has_chat_template}


def _escaped(token: str) -> str:
    """Control characters written as escapes, as the web UI's /v1/internal/logits shows them."""
    return "".join(repr(c)[1:-1] if ord(c) <= 0x1F or 0x7F <= ord(c) <= 0x9F else c for c in token)
