"""Several patterns, and a length range, that one string must satisfy together, as one grammar.

A grammar cannot say "this and that" of the same text, but for regular expressions an automaton
can: each pattern becomes a nondeterministic automaton over characters, and the states of the
deterministic automaton that runs them all at once (with a count of characters when lengths are
bounded) become the grammar's rules. The result is exact: a string is written if and only if it
satisfies every part. JSON Schema's patterns match anywhere in the string, so where a pattern has
no '^' (or '$') any characters may come before (or after) what it matches, as in the validator.

The work is bounded: past MAX_AUTOMATON_STATES the combination is refused (``TooComplex``), and
the caller decides (a 400 for a strict schema; otherwise the parts are checked after generation).
"""

from __future__ import annotations

import json
from collections import deque
from functools import lru_cache

from .errors import SchemaNotSupported
from .limits import MAX_AUTOMATON_STATES, MAX_MATCH_STEPS
from .patterns import _ALL, _SAFE, _UNSAFE, Pattern, _gbnf_class, _minus, _norm, gbnf_literal, parse
from .repeat import Rules


class TooComplex(Exception):
    """The automaton would need more than MAX_AUTOMATON_STATES states."""


class _NFA:
    """Thompson's construction: moves on character ranges, and empty moves."""

    def __init__(self, limit: int, *, matching: bool = False):
        self.moves: list[list[tuple[int, int, int]]] = []    # state -> [(lo, hi, target)]
        self.empty: list[list[int]] = []                      # state -> [target]
        self.limit = limit
        # matching: Python's sets (the ranges matched), else those a JSON string holds unescaped
        self.sets, self.any = (2, _ALL) if matching else (1, _SAFE)

    def state(self) -> int:
        if len(self.moves) >= self.limit:
            raise TooComplex()
        self.moves.append([])
        self.empty.append([])
        return len(self.moves) - 1

    def ranges(self, ranges) -> tuple[int, int]:
        s, e = self.state(), self.state()
        self.moves[s].extend((lo, hi, e) for lo, hi in ranges)
        return s, e

    def build(self, node: tuple) -> tuple[int, int]:
        kind = node[0]
        if kind == "char":
            return self.ranges([(node[1], node[1])])
        if kind == "set":
            return self.ranges(node[self.sets])
        if kind == "group":
            return self.build(node[1])
        if kind == "alt":
            s, e = self.state(), self.state()
            for branch in node[1]:
                bs, be = self.build(branch)
                self.empty[s].append(bs)
                self.empty[be].append(e)
            return s, e
        s = e = self.state()
        for atom, quant in node[1]:
            a, b = self.repeated(atom, quant or (1, 1))
            self.empty[e].append(a)
            e = b
        return s, e

    def repeated(self, atom: tuple, quant: tuple[int, int | None]) -> tuple[int, int]:
        lo, hi = quant
        s = e = self.state()
        for _ in range(lo):
            a, b = self.build(atom)
            self.empty[e].append(a)
            e = b
        if hi is None:
            a, b = self.build(atom)
            self.empty[e].append(a)
            self.empty[b].append(a)
            end = self.state()
            self.empty[e].append(end)
            self.empty[b].append(end)
            return s, end
        end = self.state()
        for _ in range(hi - lo):
            self.empty[e].append(end)
            a, b = self.build(atom)
            self.empty[e].append(a)
            e = b
        self.empty[e].append(end)
        return s, end

    def search(self, pattern: Pattern) -> tuple[int, int]:
        """The strings ``pattern`` matches somewhere in: a branch without '^' may follow any
        text, one without '$' may be followed by any."""
        s, e = self.state(), self.state()
        for seq, caret, dollar in pattern.branches():
            bs, be = self.build(seq)
            if not caret:
                pad = self.state()
                self.moves[pad].extend((lo, hi, pad) for lo, hi in self.any)
                self.empty[pad].append(bs)
                bs = pad
            if not dollar:
                pad = self.state()
                self.moves[pad].extend((lo, hi, pad) for lo, hi in self.any)
                self.empty[be].append(pad)
                be = pad
            self.empty[s].append(bs)
            self.empty[be].append(e)
        return s, e

    def closure(self, states) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for t in self.empty[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)


def _intervals(moves: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The pieces the moves' ranges cut the characters into, each inside or outside every range."""
    points = sorted({lo for lo, _, _ in moves} | {hi + 1 for _, hi, _ in moves})
    return [(a, b - 1) for a, b in zip(points, points[1:], strict=False)]


def combine(patterns: list[Pattern], min_len: int = 0, max_len: int | None = None,
            limit: int = MAX_AUTOMATON_STATES) -> "_DFA":
    """The deterministic automaton of the strings that every pattern matches (anywhere in them)
    and whose length is within bounds. Raises TooComplex past ``limit`` states."""
    nfa = _NFA(limit * 4)
    parts = [nfa.search(p) for p in patterns] or [_any_string(nfa)]
    starts = tuple(nfa.closure([s]) for s, _ in parts)
    finals = [e for _, e in parts]

    def count(n: int) -> int:
        return n if max_len is not None else min(n, min_len)

    start = (starts, 0)
    index = {start: 0}
    dfa = _DFA()
    queue = deque([start])
    while queue:
        key = queue.popleft()
        sets, n = key
        i = index[key]
        dfa.accept[i] = all(f in s for f, s in zip(finals, sets, strict=True)) and n >= min_len
        dfa.moves[i] = []
        if max_len is not None and n >= max_len:
            continue
        moves = [m for s in sets for st in s for m in nfa.moves[st]]
        by_target: dict[int, list[tuple[int, int]]] = {}
        for lo, hi in _intervals(moves):
            nxt = []
            for s in sets:
                reached = [t for st in s for (a, b, t) in nfa.moves[st] if a <= lo and hi <= b]
                if not reached:
                    break
                nxt.append(nfa.closure(reached))
            else:
                target = (tuple(nxt), count(n + 1))
                if target not in index:
                    if len(index) >= limit:
                        raise TooComplex()
                    index[target] = len(index)
                    queue.append(target)
                by_target.setdefault(index[target], []).append((lo, hi))
        dfa.moves[i] = [(_norm(r), t) for t, r in by_target.items()]
    dfa.trim()
    return dfa


def _any_string(nfa: _NFA) -> tuple[int, int]:
    s = nfa.state()
    nfa.moves[s].extend((lo, hi, s) for lo, hi in _SAFE)
    return s, s


class _DFA:
    def __init__(self):
        self.moves: dict[int, list[tuple[list[tuple[int, int]], int]]] = {}
        self.accept: dict[int, bool] = {}

    @property
    def empty(self) -> bool:
        return 0 not in self.moves

    def trim(self) -> None:
        """Drops the states from which no accepted string goes on."""
        back: dict[int, list[int]] = {}
        for s, moves in self.moves.items():
            for _, t in moves:
                back.setdefault(t, []).append(s)
        live = {s for s, ok in self.accept.items() if ok}
        todo = list(live)
        while todo:
            for s in back.get(todo.pop(), []):
                if s not in live:
                    live.add(s)
                    todo.append(s)
        self.moves = {s: [(r, t) for r, t in moves if t in live] for s, moves in self.moves.items() if s in live}

    def gbnf(self, rules: Rules, base: str = "pattern") -> str:
        """The automaton as rules of ``rules``, one per state; returns the start rule's name."""
        names = {s: rules.add(rules.fresh(f"{base}-s"), '""') for s in self.moves}
        for s, moves in self.moves.items():
            alts = [f"{piece} {names[t]}" for ranges, t in moves for piece in _pieces(ranges)]
            if self.accept[s]:
                alts.append('""')
            rules.add(names[s], " | ".join(alts))
        return names[0]


def _pieces(ranges: list[tuple[int, int]]) -> list[str]:
    """The JSON text of one character of ``ranges``: a class of those written as they are, and
    the escapes of the others."""
    out = []
    plain = _minus(ranges, _UNSAFE)
    if plain:
        out.append(_gbnf_class(plain))
    for lo, hi in _minus(ranges, plain):
        for cp in range(lo, min(hi, lo + 64) + 1):
            if not 0xD800 <= cp <= 0xDFFF:
                out.append(gbnf_literal(json.dumps(chr(cp), ensure_ascii=False)[1:-1]))
    return out


@lru_cache(maxsize=256)
def _searcher(source: str) -> tuple[_NFA, frozenset[int], int] | None:
    try:
        nfa = _NFA(MAX_AUTOMATON_STATES, matching=True)
        start, final = nfa.search(parse(source, "pattern"))
    except (SchemaNotSupported, TooComplex):
        return None
    return nfa, nfa.closure([start]), final


def search(source: str, text: str) -> bool | None:
    """Whether ``text`` holds a match of the pattern ``source``, in time linear in the text (a
    regular expression engine that backtracks can take exponential time on a hostile pattern).
    None when the pattern cannot be read here, or the text is too long for MAX_MATCH_STEPS. A
    text it accepts matches in Python's engine too; a few it refuses might (\\d, \\w and \\s
    are their ASCII parts here)."""
    compiled = _searcher(source)
    if compiled is None:
        return None
    nfa, current, final = compiled
    if len(text) * len(nfa.moves) > MAX_MATCH_STEPS:
        return None
    for ch in text:
        cp = ord(ch)
        reached = [t for s in current for (lo, hi, t) in nfa.moves[s] if lo <= cp <= hi]
        if not reached:
            return False
        current = nfa.closure(reached)
    return final in current
