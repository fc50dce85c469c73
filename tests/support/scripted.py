"""A scripted Host: the whole Host contract, with replies a test writes instead of a model's.

The API-shape tests (validation, error objects, stream events, usage, parameter mapping) need a
host that behaves like one, not a model: ``ScriptedHost`` answers each generation with the next
reply of its script, or its default reply when the script is empty, as simonw/llm's MockModel
does. The default may be a function of the prompt, for a test whose replies depend on what is
asked (a forced tool call, or the summary a compaction asks for). A reply may hold the tool-call markup the server's own parser reads
(``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; see ``call()``).

Where it differs from the real hosts (hosts/llamacpp.py, hosts/upstream.py):

* Its tokenizer is a rule, not a vocabulary: a token is a word or one punctuation character,
  each with the space before it, or one other whitespace character; ``<|endoftext|>``,
  ``<|im_start|>`` and ``<|im_end|>`` are one token each. Ids are handed out in the order texts
  are first seen (the three specials are 0, 1 and 2), so an id means the same text for the whole
  session; an id never handed out decodes as ``<id:N>``. The vocabulary size it reports is
  SmolLM2's (49,152), for the checks of token ids; its table may outgrow that and still decode.
* No text is added for a prompt (as SmolLM2: no BOS); an empty prompt stands for ``<|endoftext|>``.
* The chat template is ChatML written in Python (``<|im_start|>role\\ncontent<|im_end|>\\n``, then
  ``<|im_start|>assistant\\n``), with no default system message and no template of its own for
  tools (``chat_template`` is None, so the server uses its documented fallback); its stop is
  ``<|im_end|>``.
* Generation ignores the sampler settings, the seed and any grammar: the script is the output.
  It honours the budget (``max_new_tokens``: finish_reason "length" when the reply is longer),
  the stop event (checked before every token) and log-probabilities (made-up values, the
  sampled token first among its alternatives). A reply that begins with the end of the prompt
  (a forced tool call the server prefilled) is written without that part, as a model continues.
  Stop strings are the server's work, as with the real hosts.
* ``check_grammar`` accepts what the tests' own GBNF reader (support/gbnf.py) parses.
* Prompt scoring (echo with log-probabilities) and next-token probabilities are made up too.

Every generation is recorded (``calls``): the prompt and the settings it was given.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from openai_ext.hosts.base import ChatPrompt, Host, HostAbilities, Piece, Pieces, Prompt, TokenLogprob
from openai_ext.hosts.request import NO_CHAT_OPTIONS, ChatOptions, GenerationSettings

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TOKEN = re.compile(r"<\|(?:endoftext|im_start|im_end)\|>| ?\w+| ?[^\w\s]|\s")
VOCAB_SIZE = 49152
DEFAULT_REPLY = ("Hello! This is the scripted host's default reply, written a few words at a time so that "
                 "streams carry many deltas and small budgets cut it short.")
# The overlap of a reply with the end of its prompt counts only from this many characters on,
# so that a reply does not lose a stray first character to a coincidence.
MIN_PREFILL = 8
TOKEN_LOGPROB = -0.25


def call(name: str, arguments: dict[str, Any] | str) -> str:
    """The markup of one tool call, as the model writes it and the server parses it."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>'


def forced(arguments: dict[str, Any]) -> str:
    """A reply to a forced call, whose name the server has already written into the prompt (the
    prefill ends with ``"arguments": ``): the arguments and the end of the call."""
    return json.dumps(arguments) + "}\n</tool_call>"


@dataclass
class Reply:
    """One scripted answer. ``finish_reason``: what the host reports after the last token
    (default "stop"). ``fail_after``: raise inside the host after this many tokens, as a crashed
    backend does. ``gate``: before token ``gate_at``, wait until the gate is set (or the request
    stops), so a test holds a generation at a known point. ``started`` is set when the host
    begins the reply; ``ended`` when it has left it, whatever the reason. ``stop_takes``: seconds
    a stop asked at the gate takes to be done (a step of a large model on a CPU runs on)."""
    text: str
    finish_reason: str = "stop"
    fail_after: int | None = None
    gate: threading.Event | None = None
    gate_at: int = 0
    stop_takes: float = 0.0
    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


def held(at: int = 2, stop_takes: float = 0.0) -> Reply:
    """A long reply that waits after ``at`` tokens and is never released: only its request's end
    (the client leaving, a cancel) ends it, as a long generation on a real model is still running."""
    return Reply(" ".join(["word"] * 2000), gate=threading.Event(), gate_at=at, stop_takes=stop_takes)


@dataclass
class Call:
    """One generation the host was asked for."""
    prompt: Prompt
    settings: Any
    reply: Reply


def default_abilities() -> HostAbilities:
    """What the embedded llama.cpp host offers, FIM aside (SmolLM2 has no FIM tokens)."""
    from openai_ext.hosts.llamacpp.sampling import SAMPLERS

    return HostAbilities(samplers=SAMPLERS, logprobs=True, logit_bias=True, fim=False, vocab_size=VOCAB_SIZE,
                         grammar=True, lazy_grammar=True)


def _limit(settings: GenerationSettings) -> tuple[int, int | None]:
    """The two settings generation reads: the token budget, and the alternatives wanted per
    token (None: no log-probabilities)."""
    return settings.max_new_tokens, settings.logprobs


class ScriptedHost(Host):
    owned_by = "scripted"

    def __init__(self, *, model_id: str = "scripted-model", n_ctx: int = 2048,
                 default: str | Callable[[Prompt], str] = DEFAULT_REPLY, abilities: HostAbilities | None = None):
        self.model_id = model_id
        self.created = 1700000000
        self.n_ctx = n_ctx
        self.default = default
        self.abilities = abilities or default_abilities()
        self._initial = (default, self.abilities)
        self.replies: deque[Reply] = deque()
        self.calls: list[Call] = []
        self._ids: dict[str, int] = {t: i for i, t in enumerate(SPECIALS)}
        self._texts: list[str] = list(SPECIALS)
        self._lock = threading.Lock()
        self._running = 0
        self._stops: set[threading.Event] = set()

    # --- the script ---------------------------------------------------------------------------
    def script(self, *replies: str | Reply) -> list[Reply]:
        """Queues replies, answered in order, one per generation; returns them as Replies."""
        queued = [r if isinstance(r, Reply) else Reply(r) for r in replies]
        with self._lock:
            self.replies.extend(queued)
        return queued

    def reset(self) -> None:
        """The state of a new host: no script, no calls, the default reply and abilities."""
        with self._lock:
            self.replies.clear()
            self.calls.clear()
        self.default, self.abilities = self._initial

    def with_abilities(self, **changes: Any) -> None:
        self.abilities = dataclasses.replace(self.abilities, **changes)

    def _next(self, prompt: Prompt, settings: Any) -> Reply:
        with self._lock:
            if self.replies:
                reply = self.replies.popleft()
            else:
                reply = Reply(self.default(prompt) if callable(self.default) else self.default)
            self.calls.append(Call(prompt, settings, reply))
        return reply

    # --- tokens -------------------------------------------------------------------------------
    def context_length(self) -> int:
        return self.n_ctx

    def split(self, text: str) -> list[str]:
        """The token texts of ``text``; they join back into it."""
        return _TOKEN.findall(text)

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        pieces = self.split(text)
        with self._lock:
            out = []
            for p in pieces:
                i = self._ids.get(p)
                if i is None:
                    i = self._ids[p] = len(self._texts)
                    self._texts.append(p)
                out.append(i)
        return out

    def _text(self, token: int) -> str:
        return self._texts[token] if 0 <= token < len(self._texts) else f"<id:{token}>"

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(self._text(t) for t in tokens)

    def document_start(self) -> list[int]:
        return [SPECIALS.index("<|endoftext|>")]

    # --- prompts ------------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict[str, Any]], options: ChatOptions = NO_CHAT_OPTIONS) -> ChatPrompt:
        parts = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"<|im_start|>{m['role']}\n{content or ''}<|im_end|>\n")
        return ChatPrompt("".join(parts) + "<|im_start|>assistant\n", ["<|im_end|>"])

    def check_grammar(self, gbnf: str) -> bool:
        from support import gbnf as reader

        try:
            reader.parse(gbnf)
        except (ValueError, IndexError, RecursionError):
            return False
        return True

    # --- generation ---------------------------------------------------------------------------
    def _entry(self, token: str, top: int) -> TokenLogprob:
        entry = TokenLogprob(token, TOKEN_LOGPROB, list(token.encode()))
        if top > 0:
            others = [f"alt{i}" for i in range(1, top)]
            entry.top = [(token, TOKEN_LOGPROB, list(token.encode()))] + \
                [(t, TOKEN_LOGPROB - i, list(t.encode())) for i, t in enumerate(others, 1)]
        return entry

    def _continued(self, prompt: Prompt, text: str) -> str:
        """``text`` less what the prompt already ends with (at least MIN_PREFILL characters)."""
        for k in range(min(len(text), len(prompt.text)), MIN_PREFILL - 1, -1):
            if prompt.text.endswith(text[:k]):
                return text[k:]
        return text

    def generate(self, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event) -> Pieces:
        budget, top = _limit(settings)
        reply = self._next(prompt, settings)
        with self._lock:
            self._running += 1
            self._stops.add(stop_event)
        reply.started.set()
        try:
            if budget <= 0:
                yield Piece("", tokens=0, finish_reason="length")
                return
            tokens = self.split(self._continued(prompt, reply.text))
            if not tokens:
                yield Piece("", tokens=0, finish_reason=reply.finish_reason)
                return
            shown = tokens[:budget]
            for i, token in enumerate(shown):
                if reply.gate is not None and i == reply.gate_at:
                    while not reply.gate.wait(0.01):
                        if stop_event.is_set():
                            time.sleep(reply.stop_takes)
                            return
                if stop_event.is_set():
                    return
                if reply.fail_after is not None and i == reply.fail_after:
                    raise RuntimeError("simulated failure inside the model")
                last = i == len(shown) - 1
                finish = None if not last else "length" if len(tokens) > budget else reply.finish_reason
                yield Piece(token, tokens=1, logprob=self._entry(token, top) if top is not None else None,
                            finish_reason=finish)
        finally:
            with self._lock:
                self._running -= 1
                self._stops.discard(stop_event)
            reply.ended.set()

    def prompt_logprobs(self, tokens: list[int], top: int) -> list[TokenLogprob]:
        scored = tokens[1:] if tokens[:1] == self.document_start() else tokens
        return [self._entry(self._text(t), top) for t in scored]

    def next_token_probabilities(self, prompt: str, settings: GenerationSettings, use_samplers: bool,
                                 top: int) -> dict[str, float]:
        weights = [0.5 ** (i + 1) for i in range(top)]
        return {self._text(3 + i) if 3 + i < len(self._texts) else f"tok{i}": w for i, w in enumerate(weights)}

    def stop_all(self) -> None:
        with self._lock:
            for event in self._stops:
                event.set()

    def idle(self) -> bool:
        """No generation is under way."""
        return self._running == 0

    def describe(self) -> dict[str, Any]:
        return {"model_name": self.model_id, "lora_names": [], "loader": "scripted", "n_ctx": self.n_ctx}
