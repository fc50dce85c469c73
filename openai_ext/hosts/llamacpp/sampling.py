"""Sampling on llama.cpp's C API for the embedded host: the samplers a request may name, the
logit bias and the sampler chain, text from tokens one at a time, and grammar-constrained sampling
stepped in Python.
"""

from __future__ import annotations

import codecs
import ctypes
import re
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..request import GenerationSettings
from .context import Runtime


class Options(BaseModel):
    """The embedded host's own samplers, typed: a request's ``samplers`` (GenerationSettings) as
    this host reads them. Each default is neutral (a sampler the request does not name does
    nothing); a name this host does not take is refused (params.plan answers 400 before it gets
    here, naming the host's samplers, which are these fields). add_bos_token is not one: the
    prompt is tokenized as the model's own metadata says, before the samplers are read."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    top_k: int = 0
    min_p: float = 0.0
    typical_p: float = 1.0
    top_n_sigma: float = 0.0
    repetition_penalty: float = 1.0
    repetition_penalty_range: int = 0
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dynamic_temperature: bool = False
    dynatemp_low: float = 1.0
    dynatemp_high: float = 1.0
    dynatemp_exponent: float = 1.0
    ban_eos_token: bool = False
    skip_special_tokens: bool = True
    custom_token_bans: str = ""

    @classmethod
    def of(cls, settings: GenerationSettings) -> "Options":
        return cls.model_validate(dict(settings.samplers))


SAMPLERS = frozenset(Options.model_fields)
DRY_BREAKERS = ["\n", ":", "\"", "*"]


class Detokenizer:
    """Turns generated tokens into text one at a time. A character whose UTF-8 bytes span several
    tokens comes out whole, with the token that completes it, never as a partial character.
    (Bytes that can never form a character still come out as U+FFFD.)"""

    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        raw = self._piece(token)
        if not self._utf8.buffer:   # (no character begun by an earlier token waits for its end)
            try:
                return raw.decode()   # most tokens: whole characters, decoded without the buffer
            except UnicodeDecodeError:
                pass
        return self._utf8.decode(raw)

    def flush(self) -> str:
        """Ends the text. Bytes of a character the last token left unfinished (the generation was
        cut off mid-character) are dropped rather than sent as a replacement character."""
        self._utf8.reset()
        return ""


def logit_biases(s: GenerationSettings, eog: np.ndarray) -> dict[int, float]:
    """Token id -> logit bias, from logit_bias, custom_token_bans and ban_eos_token (``eog``:
    the tokens that end a generation, Runtime.eog)."""
    bias: dict[int, float] = dict(s.logit_bias)
    o = Options.of(s)
    for tok in filter(None, (t.strip() for t in o.custom_token_bans.split(","))):
        bias[int(tok)] = float("-inf")
    if o.ban_eos_token:
        for eog_tok in np.flatnonzero(eog):
            bias[int(eog_tok)] = float("-inf")
    return {tok: float("-inf") if b <= -100 else b for tok, b in bias.items()}


def sampler_chain(L: Any, vocab: Any, n_vocab: int, context_length: int, g: GenerationSettings,
                  biases: dict[int, float]) -> Any:
    """llama.cpp's sampler chain for these settings, in llama.cpp's usual order. A grammar is
    not part of it (see Constrained). (No preset is applied here: a sampler left to one is at
    OpenAI's default.)"""
    s = Options.of(g)
    temperature = 1.0 if g.temperature is None else g.temperature
    top_p = 1.0 if g.top_p is None else g.top_p
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    add = lambda smpl: L.llama_sampler_chain_add(chain, smpl)  # noqa: E731

    if biases:
        arr = (L.llama_logit_bias * len(biases))()
        for i, (tok, b) in enumerate(biases.items()):
            arr[i].token, arr[i].bias = tok, b
        add(L.llama_sampler_init_logit_bias(n_vocab, len(biases), arr))

    rep, freq, pres = s.repetition_penalty, g.frequency_penalty or 0.0, g.presence_penalty or 0.0
    if rep != 1.0 or freq != 0.0 or pres != 0.0:
        # OpenAI's penalties count every token generated so far, so the window is the context.
        last_n = s.repetition_penalty_range or context_length
        add(L.llama_sampler_init_penalties(n_vocab, last_n, rep, freq, pres))
    if s.dry_multiplier > 0:
        breakers = (ctypes.c_char_p * len(DRY_BREAKERS))(*[b.encode() for b in DRY_BREAKERS])
        add(L.llama_sampler_init_dry(vocab, s.dry_multiplier, s.dry_base,
                                     s.dry_allowed_length, s.repetition_penalty_range or -1,
                                     breakers, len(DRY_BREAKERS)))

    seed = L.LLAMA_DEFAULT_SEED if g.seed is None or g.seed < 0 else g.seed % 0xFFFFFFFF
    if temperature <= 0:
        add(L.llama_sampler_init_greedy())
    elif s.mirostat_mode == 1:
        add(L.llama_sampler_init_temp(temperature))
        add(L.llama_sampler_init_mirostat(n_vocab, seed, s.mirostat_tau, s.mirostat_eta, 100))
    elif s.mirostat_mode == 2:
        add(L.llama_sampler_init_temp(temperature))
        add(L.llama_sampler_init_mirostat_v2(seed, s.mirostat_tau, s.mirostat_eta))
    else:
        if s.top_n_sigma > 0:
            add(L.llama_sampler_init_top_n_sigma(s.top_n_sigma))
        if s.top_k > 0:
            add(L.llama_sampler_init_top_k(s.top_k))
        if s.typical_p < 1.0:
            add(L.llama_sampler_init_typical(s.typical_p, 1))
        if top_p < 1.0:
            add(L.llama_sampler_init_top_p(top_p, 1))
        if s.min_p > 0:
            add(L.llama_sampler_init_min_p(s.min_p, 1))
        if s.xtc_probability > 0:
            add(L.llama_sampler_init_xtc(s.xtc_probability, s.xtc_threshold, 1, seed))
        if s.dynamic_temperature:
            lo, hi = s.dynatemp_low, s.dynatemp_high
            add(L.llama_sampler_init_temp_ext((lo + hi) / 2, (hi - lo) / 2, s.dynatemp_exponent))
        else:
            add(L.llama_sampler_init_temp(temperature))
        add(L.llama_sampler_init_dist(seed))
    return chain


def greedy_alone(L: Any, chain: Any) -> bool:
    """Whether ``chain`` is llama.cpp's greedy sampler alone: then its token is the logits' argmax
    (the first of equal ones, as llama.cpp's), which a generation takes without the chain building
    its array of every token (7 us against 58 a token). Read off the chain itself, so any sampler
    ``sampler_chain`` puts before the greedy one (a bias, a penalty, DRY) keeps the chain."""
    return (L.llama_sampler_chain_n(chain) == 1
            and L.llama_sampler_name(L.llama_sampler_chain_get(chain, 0)) == b"greedy")


class Constrained:
    """Sampling under a grammar, one step at a time in Python.

    llama.cpp throws a C++ exception, which ends the process, when a grammar is handed a token
    it rejects. Inside llama_sampler_sample that happens when no token is left (the grammar
    allows only the end of text and ban_eos_token bans it, say), and with llama.cpp's lazy
    grammars whenever the token that completes the trigger carries more text than the marker
    (SmolLM2 has tokens such as "><" and ">,"). So here the bias and the grammar are applied to
    the logits, a step with no token left ends the generation, and a trigger (``grammar_triggers``:
    literal texts, after which the grammar applies) that ends inside a token is handled by
    replacing that token with the tokens of the text up to the marker's end.
    """

    def __init__(self, rt: Runtime, s: GenerationSettings, chain: Any, special: bool):
        from llama_cpp._internals import LlamaTokenDataArray

        self.rt, self.chain, self.special = rt, chain, special
        assert s.grammar, "a grammar-constrained generation without a grammar"
        self.gbnf = s.grammar
        self.triggers = [t.encode() for t in s.grammar_triggers]
        self.grammar = None if self.triggers else rt.grammar_sampler(self.gbnf)
        self.cur = LlamaTokenDataArray(n_vocab=rt.n_vocab)
        bias = logit_biases(s, rt.eog)
        self.bias_ids = np.fromiter(bias.keys(), dtype=np.intc, count=len(bias))
        self.bias = np.fromiter(bias.values(), dtype=np.single, count=len(bias))
        self.tail = b""   # the end of the output so far, to find a trigger split across tokens

    def sample(self, output: int) -> int | None:
        """The next token, from the logits of decoder output ``output`` (its index in the batch)."""
        L, cur = self.rt.L, self.cur
        cur.copy_logits(self.rt.logits(output))
        cur.candidates.data = cur.candidates_data.ctypes.data_as(L.llama_token_data_p)
        if self.bias_ids.size:
            cur.candidates_data.logit[self.bias_ids] += self.bias
        ref = ctypes.byref(cur.candidates)
        if self.grammar is not None:
            L.llama_sampler_apply(self.grammar, ref)
        if not np.isfinite(cur.candidates_data.logit).any():
            return None
        L.llama_sampler_apply(self.chain, ref)
        token = int(cur.candidates.data[cur.candidates.selected].id)
        if self.grammar is not None:
            L.llama_sampler_accept(self.grammar, token)
        L.llama_sampler_accept(self.chain, token)
        return token

    def watch(self, token: int, text: str) -> tuple[str, list[int]] | None:
        """Starts the grammar once a trigger is complete. When it ends inside ``token``, returns
        the text and tokens that replace the token: the output up to the end of the marker."""
        if self.grammar is not None or not self.triggers:
            return None
        piece = self.rt.piece(token, self.special)
        seen = self.tail + piece
        hits = [(seen.find(t), t) for t in self.triggers if t in seen]
        if not hits:
            self.tail = seen[-max(len(t) for t in self.triggers):]
            return None
        at, trigger = min(hits)
        self.grammar = self.rt.grammar_sampler(self.gbnf)
        keep = at + len(trigger) - len(self.tail)   # bytes of this token up to the marker's end
        if keep >= len(piece):
            return None
        # The rest of the token starts right after the marker's last (ASCII) character, so a
        # fresh decoder turns it into exactly the end of ``text`` that goes.
        dropped = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(piece[keep:])
        return text[:len(text) - len(dropped)], self.rt.model.tokenize(piece[:keep], add_bos=False, special=False)

    def close(self) -> None:
        if self.grammar is not None:
            self.rt.L.llama_sampler_free(self.grammar)
            self.grammar = None


# Grammars llama.cpp is never handed: its parser recurses once per nested group (a deep enough
# nesting overflows the thread's stack and ends the process) and a long grammar takes long to
# parse. The project's converter stays far below both (see text/grammar/limits.py).
MAX_GRAMMAR_CHARS = 4 << 20
MAX_GRAMMAR_NESTING = 512
_GRAMMAR_LITERALS = re.compile(r'"(?:[^"\\\n]|\\.)*"|\[(?:[^\]\\\n]|\\.)*\]')
_NOT_PARENTHESES = re.compile(r"[^()]+")


def grammar_shape_ok(gbnf: str) -> bool:
    """Whether ``gbnf`` is within MAX_GRAMMAR_CHARS and nests groups at most MAX_GRAMMAR_NESTING
    deep (literals and classes, which may hold parentheses, are left out of the count)."""
    if len(gbnf) > MAX_GRAMMAR_CHARS:
        return False
    depth = deepest = 0
    for ch in _NOT_PARENTHESES.sub("", _GRAMMAR_LITERALS.sub("", gbnf)):
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest <= MAX_GRAMMAR_NESTING
