"""The model's thinking, apart from its answer, as a reply streams.

The host says where thinking ends on the whole reply so far (``Host.split_reasoning``: the web
UI's own splitter in extension mode, which knows its models' formats; <think> tags otherwise).
This follows that split as text arrives and hands out what each side gained. A tag still being
written is held back: the end of the thinking that could be the start of its closing tag."""

from __future__ import annotations

import re
from typing import Callable

from ..hosts.base import split_think_tags

# The tail of the thinking that may be a closing tag on its way (<...> without its '>').
_OPEN_TAG = re.compile(r"<[^<>\s]{0,24}$")


class ReasoningStream:
    def __init__(self, split: Callable[[str], tuple[str | None, str]] | None = None):
        self.split = split or split_think_tags
        self.raw = ""
        self.text = ""        # thinking handed out
        self._content = ""    # answer handed out

    def feed(self, text: str, *, final: bool = False) -> tuple[str, str]:
        """(thinking, answer) gained with ``text``."""
        self.raw += text
        if not self.raw:
            return "", ""
        thought, content = self.split(self.raw)
        thought = thought or ""
        if thought and not content and not final:
            thought = _OPEN_TAG.sub("", thought)
        # What was handed out cannot be taken back: only growth is followed.
        new_thought = thought[len(self.text):] if thought.startswith(self.text) else ""
        new_content = content[len(self._content):] if content.startswith(self._content) else ""
        self.text += new_thought
        self._content += new_content
        return new_thought, new_content
