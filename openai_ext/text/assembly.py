"""Stream assembly: turns the pieces a host generates into the text a choice may show.

Pure logic, no threads and no HTTP, so the subtle parts (stop strings split across tokens,
log-probabilities that must line up with the text actually sent, exact token counts) are
tested on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..hosts.base import Piece, TokenLogprob


class StopMatcher:
    """Finds the first stop string in a stream of text fragments.

    It holds back the longest tail of the text that could still grow into a stop string, so
    no part of a stop string is ever released, however the tokens split it.
    """

    def __init__(self, stops: list[str] | None):
        self.stops = [s for s in (stops or []) if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None   # the stop string that was found

    def push(self, text: str) -> str:
        """Adds text and returns what is now safe to release."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        # The stop that completes first wins (ties: the one that starts first), which is what
        # a generator checking after every character would see, however the text is split.
        cut, cut_end = -1, -1
        for stop in self.stops:
            i = buf.find(stop)
            if i != -1 and (cut == -1 or (i + len(stop), i) < (cut_end, cut)):
                cut, cut_end, self.matched = i, i + len(stop), stop
        if cut != -1:
            self._held = ""
            self.stopped = True
            return buf[:cut]
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """Releases what was held back once the stream has ended without a stop."""
        out, self._held = self._held, ""
        return out

    def _partial_tail(self, buf: str) -> int:
        """The length of the longest end of ``buf`` that begins a stop string. Run for every
        token: for each stop, only the places that hold its first character are tried (found in
        C), the first of them giving that stop's longest candidate."""
        n, best = len(buf), 0
        for stop in self.stops:
            i = buf.find(stop[0], max(n - len(stop) + 1, 0), n - best)
            while i != -1:
                if stop.startswith(buf[i:]):
                    best = n - i
                    break
                i = buf.find(stop[0], i + 1, n - best)
        return best


@dataclass(slots=True)
class Delta:
    text: str
    logprobs: list[TokenLogprob]


class ChoiceAssembler:
    """Follows one choice: applies stop strings, releases log-probabilities in step with the
    text they belong to, counts completion tokens, and decides the finish reason."""

    def __init__(self, stops: list[str] | None, *, want_logprobs: bool = False):
        self._matcher = StopMatcher(stops)
        self._want_logprobs = want_logprobs
        self.raw_len = 0           # characters the host produced
        self.text_parts: list[str] = []
        self.sent_len = 0          # characters released so far (always a prefix of the raw text)
        self.tokens = 0
        self.tokens_known = True
        self._pending: list[tuple[int, int, TokenLogprob]] = []  # (start, end, entry) in raw text
        self._counted: list[tuple[int, int]] = []   # (start in raw text, tokens) of each piece
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None

    @property
    def stopped(self) -> bool:
        """A stop string was found: the caller should stop the host."""
        return self._matcher.stopped

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def stop(self) -> str | None:
        """The stop string that ended the choice, if one did."""
        return self._matcher.matched

    def feed(self, piece: Piece) -> Delta | None:
        if self._matcher.stopped:
            return None
        start = self.raw_len
        if piece.tokens is None:
            self.tokens_known = False
        else:
            self.tokens += piece.tokens
            self._counted.append((start, piece.tokens))
        self.raw_len += len(piece.text)
        if self._want_logprobs and piece.logprob is not None:
            self._pending.append((start, self.raw_len, piece.logprob))
        out = self._matcher.push(piece.text)
        if not self._matcher.stopped:
            return self._release(out, final=False)
        self.finish_reason = "stop"
        delta = self._release(out, final=True)
        # Only what is returned is counted: the tokens whose text is (at least in part) in the
        # reply, as its log-probabilities are; tokens wholly inside the stop string are not.
        self.tokens = sum(n for begin, n in self._counted if begin < self.sent_len)
        return delta

    def finish(self, host_reason: str | None) -> Delta | None:
        """Ends the choice after the host's last piece; returns what was still held back."""
        if self.finish_reason is None:
            self.finish_reason = host_reason or "stop"
        return self._release(self._matcher.flush(), final=True)

    def _release(self, out: str, *, final: bool) -> Delta | None:
        if out:
            self.text_parts.append(out)
            self.sent_len += len(out)
        released: list[TokenLogprob] = []
        if self._pending:
            # A token is released once all of its text is released; at the very end, a token
            # that produced any released text is kept, one cut by a stop string is dropped.
            keep = 0
            for start, end, entry in self._pending:
                if end <= self.sent_len or (final and start < self.sent_len):
                    released.append(entry)
                    keep += 1
                else:
                    break
            del self._pending[:keep]
            if final:
                self._pending.clear()
            self.logprobs.extend(released)
        if not out and not released:
            return None
        return Delta(out, released)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
