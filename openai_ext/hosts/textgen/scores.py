"""Log-probabilities from the web UI's loaders, as the web UI's own API gets them.

- llama.cpp (and ExLlamaV3): given ``state['logprobs']`` the loader asks its server for that many
  alternatives (``n_probs``) and keeps one entry per generated token in the model's
  ``last_completion_probabilities``; ``get_prompt_logprob_entries`` scores a prompt.
- Transformers-based loaders: a logits processor in ``state['logits_processor']`` sees the
  scores before each token is sampled; the token sampled shows at the next call (the last one
  only in the text, at the end). A prompt is scored with one forward pass of the model.

Entries arrive one token behind the text (the host yields a token's text before its entry), so
``Aligner`` pairs each entry with the stretch of the host's text it produced and hands both out
together, as one piece per token.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..base import Piece, TokenLogprob

# OpenAI's floor for a token the model gives no chance at all (JSON has no -Infinity).
FLOOR = -9999.0
# Entries in a row that match no text: the host's text has left the tokens behind (an output
# hook rewrote it, say), so the rest is sent without log-probabilities.
LOST_AFTER = 8

NATIVE = ("llama.cpp", "ExLlamav3")   # the model keeps last_completion_probabilities
HF = ("Transformers", "ExLlamav3_HF", "ExLlamav2_HF")   # generate_reply_HF with a logits processor


def _lp(value: Any) -> float:
    value = float(value)
    return value if math.isfinite(value) and value > FLOOR else FLOOR


@dataclass(slots=True)
class Scored:
    """One generated (or prompt) token: the text it adds to the reply ("" for the first bytes
    of a character that a later token completes) and its entry (None for a token that shows
    nothing at all: llama-server's end-of-text token, sent with no text)."""
    text: str
    entry: TokenLogprob | None


# --- llama.cpp / ExLlamaV3 entries ----------------------------------------------------------------

class NativeEntries:
    """Reads the model's ``last_completion_probabilities`` as it grows. The list is replaced by
    a new one when a generation starts; it is cleared here first, so nothing of the previous
    generation is read."""

    def __init__(self, model: Any, top: int):
        self.model, self.top = model, top
        self._list: list[Any] | None = None
        self._read = 0
        self._carry = b""
        model.last_completion_probabilities = []

    def new(self) -> list[Scored]:
        current = getattr(self.model, "last_completion_probabilities", None) or []
        if current is not self._list:
            self._list, self._read = current, 0
        fresh = current[self._read:]
        self._read += len(fresh)
        return [self._scored(e) if _shows(e) else Scored("", None) for e in fresh if isinstance(e, dict)]

    def _scored(self, e: dict[str, Any]) -> Scored:
        raw = bytes(e["bytes"]) if isinstance(e.get("bytes"), list) else str(e.get("token", "")).encode()
        text, self._carry = _complete_text(self._carry + raw)
        return Scored(text, native_entry(e, self.top))


def _shows(e: dict[str, Any]) -> bool:
    """Whether a generated token's entry shows any text. llama-server reports the end-of-text
    token too, as a token that sent nothing: it was generated (it counts) but is no part of the
    reply, so it gets no entry."""
    return bool(e.get("bytes") if isinstance(e.get("bytes"), list) else str(e.get("token", "")))


def native_entry(e: dict[str, Any], top: int) -> TokenLogprob:
    """One entry of llama-server's completion_probabilities (``logprob``, or ``prob`` when the
    server reports probabilities after sampling) as a TokenLogprob."""
    def value(d: dict[str, Any]) -> float:
        if "logprob" in d:
            return _lp(d["logprob"])
        p = float(d.get("prob", 0.0))
        return _lp(math.log(p)) if p > 0 else FLOOR

    def raw(d: dict[str, Any]) -> list[int]:
        return list(d["bytes"]) if isinstance(d.get("bytes"), list) else list(str(d.get("token", "")).encode())

    alternatives = e.get("top_logprobs", e.get("top_probs")) or []
    token = str(e.get("token", ""))
    if "logprob" not in e and "prob" not in e and alternatives:   # an older server: the best one
        e = {**alternatives[0], **e}
    return TokenLogprob(token, value(e), raw(e),
                        [(str(a.get("token", "")), value(a), raw(a)) for a in alternatives[:top]])


def _complete_text(raw: bytes) -> tuple[str, bytes]:
    """The text of ``raw`` and the bytes of a character still incomplete at its end."""
    try:
        return raw.decode("utf-8"), b""
    except UnicodeDecodeError as e:
        if e.reason == "unexpected end of data" and len(raw) - e.start < 4:
            return raw[:e.start].decode("utf-8", errors="replace"), raw[e.start:]
        return raw.decode("utf-8", errors="replace"), b""


# --- Transformers ---------------------------------------------------------------------------------

class Recorder:
    """A logits processor that records each sampled token's log-probability and the ``top``
    most likely tokens. It leaves the scores as they are. Called on the host's generation
    thread; ``entries`` only grows, so reading it from another thread is safe."""

    WINDOW = 4   # tokens decoded before a token, to find the text it adds
    CANDIDATES = 64   # the most likely tokens searched for the last one

    def __init__(self, top: int, decode: Callable[[list[int]], str], tokenizer: Any = None):
        self.top, self.decode, self.tokenizer = top, decode, tokenizer
        self.entries: list[Scored] = []
        self._row: Any = None      # log-softmax of the last scores, its token not sampled yet
        self._ids: list[int] = []  # the tokens before it
        self._read = 0

    def new(self) -> list[Scored]:
        """Entries recorded since the last call."""
        fresh = self.entries[self._read:]
        self._read += len(fresh)
        return fresh

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        ids = [int(t) for t in input_ids[0][-(self.WINDOW + 1):].tolist()]
        if self._row is not None:
            self.entries.append(self._score(self._row, ids[:-1], ids[-1]))
        self._row = torch.log_softmax(scores[0].float(), dim=-1)
        self._ids = ids
        return scores

    def finish(self, rest: str, tokenize: Callable[[str], list[int]]) -> list[Scored]:
        """The entry of the last token sampled, which no later call saw: the token that adds
        ``rest``, the text still without an entry (none when it is empty, as after an
        end-of-text token). It is found by tokenizing ``rest``, or else among the most likely
        tokens of its step."""
        row, self._row = self._row, None
        if row is None or not rest:
            return []
        ids = tokenize(rest)
        if len(ids) != 1:
            import torch

            candidates = torch.topk(row, min(self.CANDIDATES, row.shape[-1])).indices.tolist()
            ids = [t for t in candidates if self._added(self._ids[-self.WINDOW:], int(t)) == rest][:1]
        if not ids:
            return []
        self.entries.append(self._score(row, self._ids, int(ids[0])))
        return self.new()

    def _added(self, before: list[int], token: int) -> str:
        """The text ``token`` adds after ``before``, as the host decodes it: in context (a
        tokenizer may drop a token's leading space on its own), whole once a character's last
        byte is there (U+FFFD until then)."""
        head = self.decode(before).rstrip("\ufffd")
        text = self.decode(before + [token])
        return text[len(head):] if text.startswith(head) else self.decode([token])

    def _score(self, row: Any, before: list[int], token: int) -> Scored:
        import torch

        added = self._added(before[-self.WINDOW:], token)
        k = min(self.top, row.shape[-1])
        values, ids = torch.topk(row, k) if k > 0 else (row[:0], row[:0].long())
        top = [self._token(int(tid), self.decode([int(tid)])) + (_lp(value),)
               for value, tid in zip(values.tolist(), ids.tolist(), strict=False)]
        shown, raw = self._token(token, added if added and "\ufffd" not in added else self.decode([token]))
        return Scored("" if added.endswith("\ufffd") else added,
                      TokenLogprob(shown, _lp(row[token]), raw, [(t, lp, b) for t, b, lp in top]))

    def _token(self, token: int, text: str) -> tuple[str, list[int]]:
        """The token as shown, and its own bytes: from the tokenizer's vocabulary when it holds
        bytes (byte-level BPE, <0xNN> byte tokens), so a character cut in two shows the bytes
        of each half; else the text's."""
        if hasattr(self.tokenizer, "convert_ids_to_tokens"):
            raw = vocabulary_bytes(str(self.tokenizer.convert_ids_to_tokens(token)))
            if raw is not None:
                return raw.decode("utf-8", errors="replace"), list(raw)
        return text, list(text.encode())


def _byte_level() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): a printable character for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level()
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def vocabulary_bytes(token: str) -> bytes | None:
    """The bytes of a vocabulary entry: a <0xNN> byte token, or a byte-level BPE token."""
    match = _BYTE_TOKEN.fullmatch(token)
    if match:
        return bytes([int(match.group(1), 16)])
    if token and all(c in _BYTE_LEVEL for c in token):
        return bytes(_BYTE_LEVEL[c] for c in token)
    return None


def hf_prompt_scores(model: Any, ids: list[int], top: int, decode: Callable[[list[int]], str],
                     tokenizer: Any = None) -> list[Scored]:
    """Scores of ids[1:], each given the ones before it, from one forward pass (as the web UI's
    API does for echo)."""
    import torch

    tensor = torch.tensor([ids], dtype=torch.long)
    if getattr(model, "device", None) is not None and hasattr(tensor, "to"):
        tensor = tensor.to(model.device)
    with torch.inference_mode():
        logits = model(input_ids=tensor).logits[0]
    recorder = Recorder(top, decode, tokenizer)
    out = []
    for j in range(len(ids) - 1):
        row = torch.log_softmax(logits[j].float(), dim=-1)
        out.append(recorder._score(row, ids[max(0, j + 1 - Recorder.WINDOW):j + 1], ids[j + 1]))
    return out


def native_prompt_scores(model: Any, ids: list[int], top: int) -> list[Scored]:
    """Scores of ids[1:] from the llama.cpp loader's ``get_prompt_logprob_entries`` (its first,
    null entry is the start token's)."""
    entries = model.get_prompt_logprob_entries(ids, max(top, 1), prompt="")
    reader = NativeEntries.__new__(NativeEntries)
    reader.top, reader._carry = top, b""
    return [reader._scored(e) for e in entries if isinstance(e, dict) and not e.get("null_logprob")]


# --- pairing entries with the host's text --------------------------------------------------------

class Aligner:
    """Hands out the host's text one token at a time, each piece with its entry.

    Text comes first (the host yields a token's text before its entry, and may drop yields), so
    text waits for its entry. An entry whose text is not next in the host's text (an end-of-text
    token the host does not show) counts as a token without a piece of text or an entry."""

    def __init__(self) -> None:
        self.text = ""           # host text not handed out yet
        self.queue: list[Scored] = []
        self.tokens = 0
        self.lost = False
        self._misses = 0

    def add_text(self, text: str) -> None:
        self.text += text

    def add(self, scored: list[Scored]) -> None:
        self.queue.extend(scored)

    def pieces(self, final: bool = False) -> Iterator[Piece]:
        while self.queue and not self.lost:
            s = self.queue[0]
            if self.text.startswith(s.text):
                self.queue.pop(0)
                self.text = self.text[len(s.text):]
                self._misses = 0
                self.tokens += 1
                yield Piece(s.text, tokens=1, logprob=s.entry)
            elif s.text.startswith(self.text) and not final:
                return   # its text has not come yet
            else:
                self.queue.pop(0)
                self.tokens += 1
                self._misses += 1
                self.lost = self._misses >= LOST_AFTER
                yield Piece("", tokens=1)
        if self.lost and self.text:
            text, self.text = self.text, ""
            yield Piece(text, tokens=None)

