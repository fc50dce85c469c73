"""Parameter rules: what happens to each request parameter of an API, one row each.

Every family that maps a request onto another (chat and completions onto host settings,
Responses and Messages onto a chat request) states its mapping as ``Rule`` rows; the README's
tables are generated from them, and the code asks them which sent parameters are ignored by
design, so the documentation and the behaviour cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Action = Literal["mapped", "server", "ignored", "rejected"]


@dataclass(frozen=True)
class Rule:
    name: str
    endpoint: str       # the API, or for chat and completions which of them ("both")
    action: Action      # mapped onto the target, handled by the server, ignored by design, or a 400
    target: str         # what it becomes ("-": nothing)
    note: str


def ignored(rules: Iterable[Rule], sent: Iterable[str]) -> list[str]:
    """The names in ``sent`` whose rule ignores them, sorted."""
    by_name = {r.name: r for r in rules}
    return sorted(name for name in sent if name in by_name and by_name[name].action == "ignored")


def markdown_table(rules: Iterable[Rule], columns: Sequence[tuple[str, str]]) -> str:
    """A README table of ``rules``: one column per (heading, field of Rule); the name is code."""
    rows = ["| " + " | ".join(heading for heading, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rules:
        cells = [f"`{r.name}`" if f == "name" else str(getattr(r, f)) for _, f in columns]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
