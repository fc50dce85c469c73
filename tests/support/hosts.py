"""Hosts for tests: a host (the scripted one, or the real embedded one), with something put in front
of what it generates."""

from __future__ import annotations

import contextlib
import dataclasses

from openai_ext.hosts.base import Piece

THOUGHT = "The user wants colours. Red is one."


class ThinkingHost:
    """A host, its reply opened by a <think> block written over pieces (one cut inside the
    closing tag), as a reasoning model writes it: the embedded SmolLM2 has no reasoning mode."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompt, settings, stop_event):
        for text in ("<think>", THOUGHT[:10], THOUGHT[10:] + "</th", "ink>\n"):
            yield Piece(text)
        with contextlib.closing(self.inner.generate(prompt, settings, stop_event)) as pieces:
            yield from pieces


class OpenedThinkingHost(ThinkingHost):
    """A host whose chat template opens the <think> block itself (DeepSeek-R1's distills, Qwen3's
    thinking models): the prompt ends with <think>, and the reply is the thinking, its closing
    tag, then the answer."""

    def chat_prompt(self, messages, options=None):
        prompt = self.inner.chat_prompt(messages) if options is None else self.inner.chat_prompt(messages, options)
        return dataclasses.replace(prompt, text=prompt.text + "<think>\n")

    def generate(self, prompt, settings, stop_event):
        for text in (THOUGHT[:10], THOUGHT[10:] + "</th", "ink>\n\n"):
            yield Piece(text)
        with contextlib.closing(self.inner.generate(prompt, settings, stop_event)) as pieces:
            yield from pieces


class FailingHost:
    """A host, failing after a few tokens, as a backend crash would."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompt, settings, stop_event):
        with contextlib.closing(self.inner.generate(prompt, settings, stop_event)) as pieces:
            for i, piece in enumerate(pieces):
                if i == 3:
                    raise RuntimeError("the backend crashed")
                yield piece
