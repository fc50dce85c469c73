"""Context editing: ``context_management.edits``, applied to one request.

Anthropic's context editing clears old content from what the model is shown, never from the
conversation the client keeps: the client sends its history every time, and each request is
edited on its own. A server that keeps nothing between requests does exactly that.

- ``clear_tool_uses_20250919``: once the trigger is passed (``input_tokens``: the prompt's
  tokens, as count_tokens counts them; ``tool_uses``: the tool uses in the history; by default
  100,000 input tokens), the results of all tool uses but the last ``keep`` (3 by default) are
  replaced by a short note, and their inputs by ``{}`` where ``clear_tool_inputs`` asks (all of
  them, or the named tools'); tools named in ``exclude_tools`` are left alone. When that would
  clear fewer tokens than ``clear_at_least``, nothing is cleared. What was cleared is reported in
  the response's ``context_management.applied_edits``.
- ``clear_thinking_20251015``: earlier turns' thinking is never shown to the model here
  (translate.py drops it, as reasoning models' own templates do), so whatever ``keep`` asks is
  already done: accepted, and nothing to report.
- ``compact_20260112`` and unknown types get a 400: compaction writes a summary block into the
  answer, which this server does not produce.

As Anthropic requires, each type comes once, and clear_thinking first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.errors import InvalidRequestError
from .protocol import (
    ClearThinkingEdit,
    ClearToolUsesEdit,
    ContextManagement,
    CountTokensRequest,
    InputMessage,
    InputTokens,
    ToolResultBlock,
    ToolUseBlock,
    parse,
)

DEFAULT_TRIGGER = 100_000   # input tokens, Anthropic's default
DEFAULT_KEEP = 3            # tool uses, Anthropic's default
CLEARED = "[This tool result was cleared to save context.]"

Count = Callable[[CountTokensRequest], int]


@dataclass
class Edited:
    """A request as the model is shown it, and what its edits did."""
    request: CountTokensRequest
    applied: list[dict[str, Any]] = field(default_factory=list)
    tokens_before: int | None = None    # the prompt's tokens before the edits, where they were counted

    def report(self) -> dict[str, Any] | None:
        """The response's context_management: present when the request asked for editing."""
        return {"applied_edits": self.applied} if self.request.context_management is not None else None


def apply(req: CountTokensRequest, count: Count) -> Edited:
    """``req`` with its context-management edits applied; ``count`` gives a request's prompt tokens."""
    out = Edited(req)
    if req.context_management is None:
        return out
    cm = parse(ContextManagement, req.context_management, "context_management")
    if not cm.edits:
        return out
    seen: set[str] = set()
    for i, edit in enumerate(cm.edits):
        where = f"context_management.edits[{i}]"
        if not isinstance(edit, (ClearThinkingEdit, ClearToolUsesEdit)):
            if edit.type == "compact_20260112":
                raise InvalidRequestError(
                    f"{where} is compact_20260112, which this server does not do: it writes no compaction summaries. "
                    "Use clear_tool_uses_20250919, or summarise old turns yourself.", param=f"{where}.type")
            raise InvalidRequestError(
                f"{where} has type '{edit.type}', which is not a context-management edit: use "
                "clear_tool_uses_20250919 or clear_thinking_20251015.", param=f"{where}.type")
        if edit.type in seen:
            raise InvalidRequestError(f"{where} repeats {edit.type}; give each type of edit once.",
                                      param=f"{where}.type")
        if isinstance(edit, ClearThinkingEdit) and i > 0:
            raise InvalidRequestError(f"{where}: clear_thinking_20251015 must come first in context_management.edits.",
                                      param=f"{where}.type")
        seen.add(edit.type)
    for edit in cm.edits:
        if isinstance(edit, ClearToolUsesEdit):
            _clear_tool_uses(out, edit, count)
    return out


@dataclass
class _Use:
    message: int
    block: int
    use: ToolUseBlock


def _clear_tool_uses(out: Edited, edit: ClearToolUsesEdit, count: Count) -> None:
    req = out.request
    uses = [_Use(i, j, b) for i, m in enumerate(req.messages) if m.role == "assistant" and isinstance(m.content, list)
            for j, b in enumerate(m.content) if isinstance(b, ToolUseBlock)]
    results = {b.tool_use_id: (i, j, b) for i, m in enumerate(req.messages) if m.role == "user"
               and isinstance(m.content, list) for j, b in enumerate(m.content) if isinstance(b, ToolResultBlock)}
    trigger = edit.trigger or InputTokens(type="input_tokens", value=DEFAULT_TRIGGER)
    if trigger.type == "tool_uses":
        if len(uses) <= trigger.value:
            return
    else:
        out.tokens_before = _before(out, count)
        if out.tokens_before <= trigger.value:
            return
    keep = edit.keep.value if edit.keep is not None else DEFAULT_KEEP
    excluded = set(edit.exclude_tools or ())
    inputs = edit.clear_tool_inputs
    changed: dict[tuple[int, int], Any] = {}    # (message, block) -> the block as the model is shown it
    cleared = 0
    for u in uses[:max(0, len(uses) - keep)]:
        if u.use.name in excluded:
            continue
        hit = False
        if u.use.id in results:
            i, j, result = results[u.use.id]
            changed[(i, j)] = result.model_copy(update={"content": CLEARED, "is_error": None})
            hit = True
        if u.use.input and (inputs is True or (isinstance(inputs, list) and u.use.name in inputs)):
            changed[(u.message, u.block)] = u.use.model_copy(update={"input": {}})
            hit = True
        cleared += hit
    if not cleared:
        return
    touched = {i for i, _ in changed}
    edited = req.model_copy(update={"messages": [_edited(m, i, changed) if i in touched else m
                                                 for i, m in enumerate(req.messages)]})
    before = _before(out, count)
    gone = before - count(edited)
    if edit.clear_at_least is not None and gone < edit.clear_at_least.value:
        return
    out.tokens_before = before
    out.request = edited
    out.applied.append({"type": edit.type, "cleared_tool_uses": cleared, "cleared_input_tokens": gone})


def _before(out: Edited, count: Count) -> int:
    return out.tokens_before if out.tokens_before is not None else count(out.request)


def _edited(m: InputMessage, i: int, changed: dict[tuple[int, int], Any]) -> InputMessage:
    assert isinstance(m.content, list)
    return m.model_copy(update={"content": [changed.get((i, j), b) for j, b in enumerate(m.content)]})
