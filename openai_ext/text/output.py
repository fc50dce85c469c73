"""The one place where a model's output is cut into thinking, content and tool calls.

Every family renders these events its own way (chat's deltas and message, the Messages API's
content blocks, the Responses API's output items), but none of them splits text itself: the
host's reasoning splitter (``ReasoningStream``) takes the thinking off first, then the tool-call
parser (``ToolCallStream``) splits the answer into content and calls, with the same rules for
every family (calls streamed as they are generated when a grammar guarantees them, else held
until complete and validated; what follows a call without parallel calls dropped; a call cut
short by max_tokens marked in ``cut``).
"""

from __future__ import annotations

from typing import Any, Callable, Union

from ..hosts.base import THINK_OPEN
from . import tools
from .generation import Job
from .reasoning import ReasoningStream


class Thinking:
    """A stretch of the model's thinking (never part of the answer's content)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


Event = Union[Thinking, tools.Content, tools.CallDelta]


class OutputParser:
    def __init__(self, toolset: tools.ToolSet | None, *, incremental: bool,
                 split: Callable[[str], tuple[str | None, str]] | None = None, opened: bool = False):
        self.stream = tools.ToolCallStream(toolset, incremental=incremental) if toolset is not None else None
        self.reasoning = ReasoningStream(split, opened=opened)

    @classmethod
    def for_job(cls, job: Job, *, incremental: bool | None = None) -> "OutputParser":
        """The parser of one of ``job``'s answers. Calls stream as they are generated when a
        grammar guarantees them (every grammar of a job with tools covers its calls), unless
        ``incremental`` says otherwise (a whole answer is parsed at once)."""
        if incremental is None:
            incremental = bool(job.tools and job.plan.settings.grammar)
        split = job.host.split_reasoning if job.host is not None else None
        # A chat template that opens the thinking itself ends the prompt with <think>
        opened = bool(job.prompts) and job.prompts[0].text[-64:].rstrip().endswith(THINK_OPEN)
        return cls(job.tools, incremental=incremental, split=split, opened=opened)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The completed, valid calls so far, OpenAI-shaped (call k is ``calls[k]``)."""
        return self.stream.calls if self.stream is not None else []

    @property
    def cut(self) -> set[int]:
        """Indices of calls cut short inside their arguments."""
        return self.stream.cut if self.stream is not None else set()

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def thinking(self) -> str:
        """All the thinking handed out so far."""
        return self.reasoning.text

    def feed(self, text: str, *, final: bool = False) -> list[Event]:
        """The events ``text`` adds: thinking first, then the answer's content and calls.
        ``final``: the output is over; whatever was held back comes out (a call still open is
        cut, thinking without its end is thinking)."""
        thought, answer = self.reasoning.feed(text, final=final)
        out: list[Event] = [Thinking(thought)] if thought else []
        if self.stream is None:
            return out + ([tools.Content(answer)] if answer else [])
        out += self.stream.feed(answer)
        if final:
            out += self.stream.finish()
        return out
