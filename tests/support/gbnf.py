"""A small GBNF reader for tests: parses a grammar as llama.cpp writes it, tells whether a text is
in its language, and samples texts from it. Independent of the converter under test."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from functools import lru_cache

# An item: ("lit", text) | ("cls", ranges, negated) | ("ref", name) | ("grp", alternatives),
# each with a quantifier (lo, hi); hi None is no limit.


@dataclass
class Grammar:
    rules: dict[str, list[list[tuple]]] = field(default_factory=dict)


_ESC = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "/": "/"}


class _Reader:
    def __init__(self, text: str):
        self.s, self.i = text, 0

    def ws(self, newlines: bool) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                break

    def char(self) -> str:
        c = self.s[self.i]
        if c != "\\":
            self.i += 1
            return c
        e = self.s[self.i + 1]
        if e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            value = int(self.s[self.i + 2:self.i + 2 + width], 16)
            self.i += 2 + width
            return chr(value)
        if e not in _ESC:
            raise ValueError(f"unknown escape \\{e} at {self.i}")
        self.i += 2
        return _ESC[e]

    def name(self) -> str:
        start = self.i
        while self.i < len(self.s) and (self.s[self.i].isascii() and (self.s[self.i].isalnum() or self.s[self.i] in "-_")):
            self.i += 1
        if start == self.i:
            raise ValueError(f"a rule name is expected at {self.i}: {self.s[self.i:self.i + 30]!r}")
        return self.s[start:self.i]

    def alternatives(self, nested: bool) -> list[list[tuple]]:
        alts = [self.sequence(nested)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            self.ws(True)
            alts.append(self.sequence(nested))
        return alts

    def sequence(self, nested: bool) -> list[tuple]:
        seq: list[tuple] = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                text = ""
                while self.s[self.i] != '"':
                    text += self.char()
                self.i += 1
                seq.append((("lit", text), (1, 1)))
            elif c == "[":
                self.i += 1
                negated = self.s[self.i] == "^"
                self.i += negated
                ranges = []
                while self.s[self.i] != "]":
                    lo = self.char()
                    hi = lo
                    if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                        self.i += 1
                        hi = self.char()
                    ranges.append((ord(lo), ord(hi)))
                self.i += 1
                seq.append((("cls", tuple(ranges), negated), (1, 1)))
            elif c == "(":
                self.i += 1
                self.ws(True)
                alts = self.alternatives(True)
                if self.s[self.i] != ")":
                    raise ValueError(f"')' expected at {self.i}")
                self.i += 1
                seq.append((("grp", alts), (1, 1)))
            elif c in "*+?":
                if not seq:
                    raise ValueError(f"a quantifier with nothing before it at {self.i}")
                item, _ = seq.pop()
                seq.append((item, {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]))
                self.i += 1
            elif c.isascii() and (c.isalnum() or c in "-_"):
                seq.append((("ref", self.name()), (1, 1)))
            else:
                break
            self.ws(nested)
        return seq


def parse(text: str) -> Grammar:
    r = _Reader(text)
    g = Grammar()
    r.ws(True)
    while r.i < len(r.s):
        name = r.name()
        r.ws(False)
        if not r.s.startswith("::=", r.i):
            raise ValueError(f"'::=' expected after {name}")
        r.i += 3
        r.ws(True)
        if name in g.rules:
            raise ValueError(f"rule {name} defined twice")
        g.rules[name] = r.alternatives(False)
        if r.i < len(r.s) and r.s[r.i] not in "\r\n":
            raise ValueError(f"end of line expected at {r.i}: {r.s[r.i:r.i + 30]!r}")
        r.ws(True)
    for name, alts in g.rules.items():
        for ref in _refs(alts):
            if ref not in g.rules:
                raise ValueError(f"rule {name} refers to the undefined rule {ref}")
    return g


def _refs(alts):
    for seq in alts:
        for item, _ in seq:
            if item[0] == "ref":
                yield item[1]
            elif item[0] == "grp":
                yield from _refs(item[1])


def _in_class(item, ch: str) -> bool:
    inside = any(lo <= ord(ch) <= hi for lo, hi in item[1])
    return inside != item[2]


def matches(g: Grammar, text: str, start: str = "root") -> bool:
    """Whether ``text`` is in the language of rule ``start`` (the grammar must not be left recursive)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        return len(text) in _Matcher(g, text).rule(start, 0)
    finally:
        sys.setrecursionlimit(old)


class _Matcher:
    def __init__(self, g: Grammar, text: str):
        self.g, self.t = g, text
        self.rule = lru_cache(maxsize=None)(self._rule)

    def _rule(self, name: str, pos: int) -> frozenset[int]:
        return frozenset(self.alts(self.g.rules[name], pos))

    def alts(self, alts, pos: int) -> set[int]:
        out: set[int] = set()
        for seq in alts:
            ends = {pos}
            for item, quant in seq:
                ends = set().union(*(self.quantified(item, quant, e) for e in ends)) if ends else set()
            out |= ends
        return out

    def quantified(self, item, quant, pos: int) -> set[int]:
        lo, hi = quant
        reached, frontier, count = set(), {pos}, 0
        if lo == 0:
            reached.add(pos)
        seen = {pos}
        while frontier and (hi is None or count < hi):
            count += 1
            frontier = set().union(*(self.one(item, p) for p in frontier))
            if count >= lo:
                reached |= frontier
            if hi is None:
                frontier -= seen
                seen |= frontier
        return reached

    def one(self, item, pos: int) -> set[int]:
        kind = item[0]
        if kind == "lit":
            return {pos + len(item[1])} if self.t.startswith(item[1], pos) else set()
        if kind == "cls":
            return {pos + 1} if pos < len(self.t) and _in_class(item, self.t[pos]) else set()
        if kind == "ref":
            return set(self.rule(item[1], pos))
        return self.alts(item[1], pos)


# sampling -------------------------------------------------------------------------------------

def _min_lengths(g: Grammar) -> dict[str, float]:
    best = {name: float("inf") for name in g.rules}

    def seq_len(seq):
        total = 0.0
        for item, (lo, _) in seq:
            if lo:
                total += lo * item_len(item)
        return total

    def item_len(item):
        if item[0] == "lit":
            return len(item[1])
        if item[0] == "cls":
            return 1
        if item[0] == "ref":
            return best[item[1]]
        return min(seq_len(s) for s in item[1])

    changed = True
    while changed:
        changed = False
        for name, alts in g.rules.items():
            value = min(seq_len(s) for s in alts)
            if value < best[name]:
                best[name], changed = value, True
    return best


def _pick_char(item, rng: random.Random) -> str:
    ranges = item[1]
    if item[2]:  # negated: printable ASCII outside the class
        options = [chr(c) for c in range(0x20, 0x7F) if not any(lo <= c <= hi for lo, hi in ranges)]
        return rng.choice(options)
    ascii_part = [(max(lo, 0x20), min(hi, 0x7E)) for lo, hi in ranges if lo <= 0x7E and hi >= 0x20]
    if ascii_part and rng.random() < 0.85:
        lo, hi = rng.choice(ascii_part)
    else:
        lo, hi = rng.choice(ranges)
    return chr(rng.randint(lo, min(hi, lo + 2000)))


def sample(g: Grammar, rng: random.Random, start: str = "root", budget: int = 60) -> str:
    """A random text of the language of ``start``; past ``budget`` rule expansions it takes the
    shortest ways out."""
    lengths = _min_lengths(g)
    out: list[str] = []
    state = {"steps": 0}

    def seq_min(seq):
        total = 0.0
        for item, (lo, _) in seq:
            if lo:
                total += lo * (len(item[1]) if item[0] == "lit" else 1 if item[0] == "cls" else
                               lengths[item[1]] if item[0] == "ref" else min(seq_min(s) for s in item[1]))
        return total

    def alts(options):
        if state["steps"] > budget:
            seq = min(options, key=seq_min)
        else:
            seq = rng.choice(options)
        for item, (lo, hi) in seq:
            if state["steps"] > budget:
                count = lo
            else:
                top = hi if hi is not None else lo + 3
                count = rng.randint(lo, top)
            for _ in range(count):
                one(item)

    def one(item):
        kind = item[0]
        if kind == "lit":
            out.append(item[1])
        elif kind == "cls":
            out.append(_pick_char(item, rng))
        elif kind == "ref":
            state["steps"] += 1
            alts(g.rules[item[1]])
        else:
            alts(item[1])

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        alts(g.rules[start])
    finally:
        sys.setrecursionlimit(old)
    return "".join(out)
