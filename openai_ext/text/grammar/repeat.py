"""Bounded repetitions as GBNF, never ``{m,n}`` (the web UI's Transformers grammar does not read
it, and llama.cpp writes out one rule per repetition).

A few repetitions are written out, nested: ``a a (a (a)?)?``. More would make the grammar grow
with the count, and llama.cpp's parser recurses once per nested group, so a ``maxLength`` of
524288 would be half a million nested groups. Past ``WRITE_OUT``, counts are written in binary
instead: ``E0 ::= a``, ``E1 ::= E0 E0``, ... (2^k items each) and ``U_k ::= E_{k-1}? U_{k-1}``
(0 to 2^k - 1 items), so any count costs O(log n) rules and the language is exactly the same.
A text has one derivation, and while it is read llama.cpp keeps one stack per level at most.
"""

from __future__ import annotations

from typing import Protocol

WRITE_OUT = 64        # optional repetitions written out as nested groups, at most


class Rules(Protocol):
    """Where helper rules go: the grammar being written."""

    def fresh(self, base: str) -> str:
        """A rule name not yet used, made from ``base``."""

    def add(self, name: str, body: str) -> str:
        """Defines (or redefines) rule ``name``; returns the name."""


def new_rule(rules: Rules, base: str, body: str) -> str:
    return rules.add(rules.fresh(base), body)


def _chain(item: str, k: int) -> str:
    """0 to k ``item``s, written out (k >= 1)."""
    nested = ""
    for _ in range(k):
        nested = f"({item} {nested})?" if nested else f"({item})?"
    return nested


class _Counter:
    """Rules for exact and bounded counts of one item, made as they are needed."""

    def __init__(self, item: str, rules: Rules, base: str):
        self.rule = lambda name, body: new_rule(rules, name, body)  # noqa: E731
        self.base = base
        self.exact = [item if _is_name(item) else self.rule(f"{base}-x1", item)]   # exact[j]: 2^j items
        self.upto: dict[int, str] = {}                                        # k: 0..2^k-1 items

    def power(self, j: int) -> str:
        while len(self.exact) <= j:
            prev = self.exact[-1]
            self.exact.append(self.rule(f"{self.base}-x{2 ** len(self.exact)}", f"{prev} {prev}"))
        return self.exact[j]

    def times(self, n: int) -> str:
        """Exactly n items."""
        if n <= WRITE_OUT:
            return " ".join([self.exact[0]] * n)
        return " ".join(self.power(j) for j in range(n.bit_length() - 1, -1, -1) if n >> j & 1)

    def below(self, k: int) -> str:
        """0 to 2^k - 1 items (k >= 1)."""
        if k not in self.upto:
            inner = f"{self.power(k - 1)}?" if k == 1 else f"{self.power(k - 1)}? {self.below(k - 1)}"
            self.upto[k] = self.rule(f"{self.base}-u{2 ** k - 1}", inner)
        return self.upto[k]

    def at_most(self, m: int) -> str:
        """0 to m items (m >= 1)."""
        if m <= WRITE_OUT:
            return _chain(self.exact[0], m)
        k = (m + 1).bit_length() - 1
        if m == 2 ** k - 1:
            return self.below(k)
        # up to 2^k - 1, or 2^k and then up to the rest
        return self.rule(f"{self.base}-m{m}", f"{self.below(k)} | {self.power(k)} {self.at_most(m - 2 ** k)}")


def _is_name(expr: str) -> bool:
    return expr.replace("-", "").isalnum() and expr.isascii()


def repeat(item: str, lo: int, hi: int | None, *, sep: str = "", lead: bool = False,
           rules: Rules | None = None, base: str = "rep") -> str:
    """``item`` lo to hi times (None: no limit); ``sep`` goes between two items, and before the
    first one too when ``lead`` (something came before). Counts past WRITE_OUT are written with
    helper rules (named after ``base``) in ``rules``; without it, everything is written out."""
    first = f"{sep} {item}" if (sep and lead) else item
    more = f"{sep} {item}" if sep else item
    if rules is None or (lo <= WRITE_OUT and (hi is None or hi - lo <= WRITE_OUT)):
        return _written(item, first, more, lo, hi, lead)
    counter = _Counter(more, rules, base)
    parts = []
    if lo:
        parts.append(first)
        if lo > 1:
            parts.append(counter.times(lo - 1))
        if hi is None:
            parts.append(f"{counter.exact[0]}*")
        elif hi > lo:
            parts.append(counter.at_most(hi - lo))
    elif hi:
        rest = f" {counter.at_most(hi - 1)}" if hi > 1 else ""
        parts.append(f"({first}{rest})?")
    return " ".join(parts) or '""'


def _written(item: str, first: str, more: str, lo: int, hi: int | None, lead: bool) -> str:
    parts = [first] + [more] * (lo - 1) if lo else []
    if hi is None:
        tail = f"({more})*" if lo or lead else f"({item} ({more})*)?"
    else:
        tail, nested = "", ""
        for k in range(hi - lo):
            head = first if (not lo and k == hi - lo - 1) else more
            nested = f"({head} {nested})?" if nested else f"({head})?"
        tail = nested
    return " ".join(p for p in [*parts, tail] if p) or '""'
