"""The model's thinking, apart from its answer, as a reply streams.

The host says where thinking ends on the whole reply so far (``Host.split_reasoning``: the web
UI's own splitter in extension mode, which knows its models' formats; <think> tags otherwise).
This follows that split as text arrives and hands out what each side gained. A tag still being
written is held back: the end of the thinking that could be the start of its closing tag.

A splitter is asked about the whole reply at every token, so a long reply costs more with each
token. The <think> tags' split is followed instead where that gives the same answer: once a
reply is known to be answering, or thinking with no closing tag yet, or answering after its
thinking, only the text that arrived (and the few characters before it) is looked at. Anything
else (the reply's start, the closing tag arriving) asks the splitter as before."""

from __future__ import annotations

import re
from typing import Callable

from ..hosts.base import THINK_CLOSE, THINK_OPEN, Host, split_think_tags

# The tail of the thinking that may be a closing tag on its way (<...> without its '>'). \Z,
# not $: $ also matches before a last newline, and thinking that ends "<b\n" would lose its "<b".
_OPEN_TAG = re.compile(r"<[^<>\s]{0,24}\Z")
_OPEN_TAG_MOST = 25

# Where a reply stands, for the <think> tags' split (None: ask the splitter).
_ANSWER = "answer"       # no thinking: all of it is answer, and no closing tag came
_THINKING = "thinking"   # inside <think>, no closing tag yet
_AFTER = "after"         # the thinking is over and handed out, the answer has begun


class ReasoningStream:
    """``opened``: the prompt ended with <think> (the chat template opened the thinking), so the
    reply is read as if the model had written it: what comes before its </think> is thinking from
    the first token on. A splitter that sees only the reply finds the thinking once </think>
    comes (the web UI's too: its end-only format), by which time a stream has sent it as the
    answer and cannot take it back."""

    def __init__(self, split: Callable[[str], tuple[str | None, str]] | None = None, *, opened: bool = False):
        self.split = split or split_think_tags
        self._tags = self.split is split_think_tags or getattr(self.split, "__func__", None) is Host.split_reasoning
        self.raw = THINK_OPEN if opened else ""
        self.text = ""        # thinking handed out
        self._content = ""    # answer handed out
        self._state: str | None = None
        self._body = 0        # where the thinking starts in ``raw`` (_THINKING)

    def feed(self, text: str, *, final: bool = False) -> tuple[str, str]:
        """(thinking, answer) gained with ``text``."""
        self.raw += text
        if not self.raw:
            return "", ""
        if self._state is not None:
            gained = self._follow(text, final)
            if gained is not None:
                return gained
        return self._ask(final)

    def _ask(self, final: bool) -> tuple[str, str]:
        """What the splitter says of the whole reply."""
        split, content = self.split(self.raw)
        thought = split or ""
        if thought and not content and not final:
            thought = _OPEN_TAG.sub("", thought)
        # What was handed out cannot be taken back: only growth is followed.
        new_thought = thought[len(self.text):] if thought.startswith(self.text) else ""
        new_content = content[len(self._content):] if content.startswith(self._content) else ""
        self.text += new_thought
        self._content += new_content
        if self._tags:
            self._state = self._where(split, thought, content)
        return new_thought, new_content

    def _where(self, split: str | None, thought: str, content: str) -> str | None:
        """Where the reply stands after the splitter was asked, if following it from here gives
        what asking would."""
        stripped = self.raw.lstrip()
        if split is None:   # answering, unless what came so far may yet open a <think>
            return _ANSWER if stripped and not THINK_OPEN.startswith(stripped) else None
        if content and content == self._content and thought == self.text:
            return _AFTER
        if not content and thought == self.text and stripped.startswith(THINK_OPEN) and THINK_CLOSE not in stripped:
            self._body = len(self.raw) - len(stripped) + len(THINK_OPEN)
            return _THINKING
        return None

    def _follow(self, text: str, final: bool) -> tuple[str, str] | None:
        """What ``text`` adds, looking only at it; None where the splitter must be asked."""
        if self._state == _AFTER:
            self._content += text
            return "", text
        if THINK_CLOSE in self.raw[max(0, len(self.raw) - len(text) - len(THINK_CLOSE) + 1):]:
            return None
        if self._state == _ANSWER:
            self._content += text
            return "", text
        # _THINKING: the thinking is everything after <think>, less a tag still being written
        end = len(self.raw)
        if not final:
            held = _OPEN_TAG.search(self.raw, max(self._body, end - _OPEN_TAG_MOST))
            if held is not None:
                end = held.start()
        new_thought = self.raw[self._body + len(self.text):end]
        self.text += new_thought
        return new_thought, ""
