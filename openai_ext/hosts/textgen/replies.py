"""What the web UI's generate_reply yields, followed: its cumulative texts turned into new
text, and the failures it only logs."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from dataclasses import replace
from typing import Iterator

from ..base import Pieces

log = logging.getLogger(__name__)

# What a decoder shows for a character whose bytes have not all been generated yet.
REPLACEMENT = "\ufffd"


class HostFailures(logging.Handler):
    """The host catches a failed generation and only logs it (generate_reply_custom / _HF log
    "Failed to generate reply"), so its reply just stops short. This notices that record, when
    it comes from the generating thread, so the client gets an error instead of a cut reply."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.thread = threading.get_ident()
        self.error: BaseException | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread and self.error is None and record.exc_info:
            self.error = record.exc_info[1]


@contextlib.contextmanager
def host_failures() -> Iterator[HostFailures]:
    watcher = HostFailures()
    host_log = _host_logger()
    if host_log is not None:
        host_log.addHandler(watcher)
    try:
        yield watcher
    finally:
        if host_log is not None:
            host_log.removeHandler(watcher)


def _host_logger() -> logging.Logger | None:
    try:
        return getattr(importlib.import_module("modules.logging_colors"), "logger", None)
    except ImportError:
        return None


class Follower:
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


class Turns:
    """Generations that may run side by side, and ones that must run alone.

    A generation that must run alone waits until the others have finished, and the ones that
    come after it wait for it (first come first served, so it is not starved). Waiting gives up
    when the generation's stop event is set (its client left)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._alone = False
        self._waiting_alone = 0

    @contextlib.contextmanager
    def take(self, alone: bool, stop: threading.Event) -> Iterator[bool]:
        """Waits for the turn; gives whether it came (False: stopped while waiting)."""
        got = False
        with self._cond:
            self._waiting_alone += alone
            while not stop.is_set():
                if not (self._alone or (self._running if alone else self._waiting_alone)):
                    self._running += 1
                    self._alone, got = alone, True
                    break
                self._cond.wait(0.1)
            self._waiting_alone -= alone
            self._cond.notify_all()
        if not got:
            yield False
            return
        try:
            yield True
        finally:
            with self._cond:
                self._running -= 1
                self._alone = self._alone and not alone
                self._cond.notify_all()


def chat_reply(pieces: Pieces) -> Pieces:
    """The reply as the web UI's chat and chat-instruct modes show it: without the space the
    model writes after "Name:" (its chatbot_wrapper strips the reply's start, unless it continues
    a message). Pieces of only that space still count their tokens."""
    started = False
    with contextlib.closing(pieces):   # closed at once: the host's lock is released in its finally
        for piece in pieces:
            if not started:
                text = piece.text.lstrip()
                started = bool(text)
                piece = replace(piece, text=text)
            yield piece
