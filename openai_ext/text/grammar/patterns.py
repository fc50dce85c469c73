"""Regular expressions (a schema's ``pattern``) as GBNF for the JSON text of matching strings.

A pattern constrains the decoded string; the grammar writes its JSON text. Literal characters
are written with their JSON escapes. Character classes and '.' keep only characters a JSON
string holds unescaped (no '"', '\\' or control characters): fewer strings, all matching.

``parse`` reads a pattern into a small tree (``Pattern``), which is written as grammar as it
stands, or turned into an automaton (``automata``) when it must be combined with other patterns
or with lengths. Counted repetitions of any size cost O(log n) rules (see ``repeat``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import SchemaNotSupported
from .limits import MAX_PATTERN_CHARS, MAX_PATTERN_NESTING
from .repeat import Rules, new_rule, repeat


def _norm(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, b = [], _norm(b)
    for lo, hi in _norm(a):
        for blo, bhi in b:
            if bhi < lo or blo > hi:
                continue
            if blo > lo:
                out.append((lo, blo - 1))
            lo = bhi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return out


_UNSAFE = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F), (0xD800, 0xDFFF)]
_ALL = [(0, 0x10FFFF)]
_SAFE = _minus(_ALL, _UNSAFE)
_ASCII = [(0x20, 0x7E)]
_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [(0x20, 0x20)]
# Python's \d, \w and \s match more than ASCII, so these are their ASCII parts (exact within
# printable ASCII), and the negated ones stay within printable ASCII.
_SHORTHANDS = {"d": _DIGIT, "w": _WORD, "s": _SPACE, "D": _minus(_ASCII, _DIGIT), "W": _minus(_ASCII, _WORD),
               "S": _minus(_ASCII, _SPACE)}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


def _gbnf_char(cp: int) -> str:
    ch = chr(cp)
    if ch.isascii() and ch.isalnum():
        return ch
    return f"\\x{cp:02X}" if cp < 0x100 else f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}"


_LITERAL_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal that matches exactly it."""
    return '"' + "".join(_LITERAL_ESCAPES.get(ch) or (ch if 0x20 <= ord(ch) < 0x7F else _gbnf_char(ord(ch)))
                         for ch in text) + '"'


def _gbnf_class(ranges: list[tuple[int, int]]) -> str:
    return "[" + "".join(_gbnf_char(lo) if lo == hi else f"{_gbnf_char(lo)}-{_gbnf_char(hi)}"
                         for lo, hi in ranges) + "]"


# The tree: ("char", code point) | ("set", ranges written, ranges matched) | ("group", alt) |
# ("alt", [seq, ...]) | ("seq", [(atom, (lo, hi) or None), ...], caret, dollar), hi None meaning no
# limit. A set's ranges written keep the characters a JSON string holds unescaped; its ranges
# matched (automata.search) are all those Python's engine matches, or fewer (\d is its ASCII part).


@dataclass
class Pattern:
    """A parsed pattern: its tree, and the text it came from."""
    source: str
    tree: tuple
    lengths: tuple[int, float] = field(init=False)   # shortest and longest full match

    def __post_init__(self):
        self.lengths = _lengths(self.tree)

    def gbnf(self, rules: Rules | None = None) -> str:
        """GBNF for the JSON text of the pattern's full matches (``rules`` takes the helper
        rules of long counted repetitions)."""
        return _render(self.tree, rules)

    def branches(self) -> list[tuple[tuple, bool, bool]]:
        """The top-level alternatives, each with whether it is anchored at its start and end
        (a '^' or '$' anywhere in it counts: what it matches in full then matches anyway)."""
        seqs = self.tree[1]
        return [(seq, seq[2], seq[3]) for seq in seqs]


def parse(pattern: Any, where: str) -> Pattern:
    """The tree of ``pattern``; a 400 naming ``where`` for what cannot be enforced."""
    if not isinstance(pattern, str):
        raise SchemaNotSupported(f"{where} must be a string.", param=where)
    if len(pattern) > MAX_PATTERN_CHARS:
        raise SchemaNotSupported(f"{where}: a pattern of more than {MAX_PATTERN_CHARS} characters cannot be "
                                 "enforced while generating.", param=where)
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise SchemaNotSupported(f"{where}: {pattern!r} is not a valid regular expression ({e}).",
                                 param=where) from None
    return Pattern(pattern, _Parser(pattern, where).parse())


def pattern_gbnf(pattern: Any, where: str, rules: Rules | None = None) -> str:
    """GBNF for the JSON text (between the quotes) of strings that match ``pattern``."""
    return parse(pattern, where).gbnf(rules)


def _lengths(node: tuple) -> tuple[int, float]:
    kind = node[0]
    if kind in ("char", "set"):
        return 1, 1
    if kind == "group":
        return _lengths(node[1])
    if kind == "alt":
        spans = [_lengths(b) for b in node[1]]
        return min(s[0] for s in spans), max(s[1] for s in spans)
    lo, hi = 0, 0.0
    for atom, quant in node[1]:
        a, b = _lengths(atom)
        q_lo, q_hi = quant or (1, 1)
        lo += a * q_lo
        if q_hi != 0 and b:
            hi += float("inf") if q_hi is None else b * q_hi
    return lo, hi


def _literal_text(cp: int) -> str:
    return json.dumps(chr(cp), ensure_ascii=False)[1:-1]   # as the JSON string writes it


def _render(node: tuple, rules: Rules | None) -> str:
    kind = node[0]
    if kind == "char":
        return gbnf_literal(_literal_text(node[1]))
    if kind == "set":
        return _gbnf_class(node[1])
    if kind == "group":
        return f"({_render(node[1], rules)})"
    if kind == "alt":
        branches = [_render(b, rules) for b in node[1]]
        return branches[0] if len(branches) == 1 else "(" + " | ".join(branches) + ")"
    parts: list[str] = []
    text = ""
    for atom, quant in node[1]:
        if atom[0] == "char" and quant is None:
            text += _literal_text(atom[1])   # neighbouring literal characters become one string
            continue
        if text:
            parts.append(gbnf_literal(text))
            text = ""
        if not quant:
            parts.append(_render(atom, rules))
            continue
        item = _render(atom, rules)
        if rules is not None and atom[0] == "group" and "(" in item[1:]:
            # a group holding groups or repetitions becomes a rule: written-out repetitions
            # never nest inside each other, so no rule nests deeper than a few dozen groups
            item = new_rule(rules, "pattern-g", item)
        parts.append(_quantified(f"({item})", quant, rules))
    if text:
        parts.append(gbnf_literal(text))
    return " ".join(parts) or '""'


def _quantified(item: str, quant: tuple[int, int | None], rules: Rules | None) -> str:
    lo, hi = quant
    if (lo, hi) in ((0, None), (1, None), (0, 1)):
        return item + {(0, None): "*", (1, None): "+", (0, 1): "?"}[(lo, hi)]
    if hi is None:
        return " ".join([repeat(item, lo, lo, rules=rules, base="pattern"), item + "*"])
    return repeat(item, lo, hi, rules=rules, base="pattern")


class _Parser:
    """Regular expressions of the usual kind: literals, escapes, classes, '.', groups, '|',
    quantifiers, and ^/$ where they hold trivially. What is written matches in full, so it
    matches as JSON Schema asks (anywhere in the string) too."""

    def __init__(self, src: str, where: str):
        self.src, self.where, self.i, self.depth = src, where, 0, 0

    def fail(self, what: str):
        raise SchemaNotSupported(f"{self.where}: {what} in the pattern {self.src!r} cannot be enforced while "
                                 "generating; rewrite the pattern without it.", param=self.where)

    def peek(self, k: int = 0) -> str:
        return self.src[self.i + k] if self.i + k < len(self.src) else ""

    def parse(self) -> tuple:
        tree = self.alternation(at_start=True)
        if self.i != len(self.src):  # re.compile accepted it, so this is an unbalanced ')'
            self.fail("an unbalanced ')'")
        return tree

    def alternation(self, at_start: bool) -> tuple:
        branches = [self.sequence(at_start)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence(at_start))
        return ("alt", branches)

    def sequence(self, at_start: bool) -> tuple:
        items: list[tuple[tuple, Any]] = []
        caret = dollar = False
        while self.peek() and self.peek() not in "|)":
            c = self.peek()
            if c == "$":
                self.i += 1
                dollar = True
                continue
            if dollar:
                self.fail("text after '$'")
            if c == "^":
                self.i += 1
                if not at_start or items:
                    self.fail("'^' after the start")
                caret = True
                continue
            atom = self.atom(at_start and not items)
            quantifier = self.quantifier()
            anchors = _anchors(atom)
            if quantifier and any(anchors):
                self.fail("a repeated '^' or '$'")
            caret, dollar = caret or anchors[0], dollar or anchors[1]
            items.append((atom, quantifier))
        return ("seq", items, caret, dollar)

    def quantifier(self) -> tuple[int, int | None] | None:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            q = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{":
            m = re.compile(r"\{(\d*)(,?)(\d*)\}").match(self.src, self.i)
            if not m or not (m.group(1) or m.group(3)) or (m.group(3) and not m.group(2)):
                return None  # Python reads this '{' as a literal character
            lo = int(m.group(1) or 0)
            hi = None if m.group(2) and not m.group(3) else int(m.group(3) or lo)
            self.i = m.end()
            q = (lo, hi)
        else:
            return None
        if self.peek() == "?":
            self.i += 1  # lazy: the same strings match
        elif self.peek() == "+":
            self.fail("a possessive quantifier")
        return q

    def atom(self, at_start: bool) -> tuple:
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.src.startswith("?:", self.i):
                self.i += 2
            elif self.src.startswith("?P<", self.i) or (self.src.startswith("?<", self.i)
                                                          and self.peek(2) not in ("=", "!")):
                self.i = self.src.index(">", self.i) + 1
            elif self.peek() == "?":
                self.fail(f"the group '(?{self.peek(1)}'")
            self.depth += 1
            if self.depth > MAX_PATTERN_NESTING:
                self.fail(f"groups nested more than {MAX_PATTERN_NESTING} deep")
            inner = self.alternation(at_start)
            self.depth -= 1
            self.i += 1  # ')'
            return ("group", inner)
        if c == "[":
            return ("set", *self.char_class())
        if c == ".":
            self.i += 1
            return ("set", _SAFE, _minus(_ALL, [(0x0A, 0x0A)]))
        if c == "\\":
            kind, value = self.escape(in_class=False)
            if kind == "set":
                return ("set", _minus(value, _UNSAFE), value)
            return ("char", value)
        self.i += 1
        return ("char", ord(c))

    def escape(self, *, in_class: bool) -> tuple[str, Any]:
        """An escape at self.i: ("set", ranges) or ("char", code point)."""
        e = self.peek(1)
        self.i += 2
        if e in _SHORTHANDS:
            return "set", _SHORTHANDS[e]
        if e == "b" and in_class:
            return "char", 0x08
        if e in _CHAR_ESCAPES:
            return "char", ord(_CHAR_ESCAPES[e])
        if e == "0" and not self.peek().isdigit():
            return "char", 0
        if e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            digits = self.src[self.i:self.i + width]
            self.i += width
            return "char", int(digits, 16)
        if e.isdigit():
            self.fail("a back-reference")
        if e.isalnum():
            self.fail(f"'\\{e}'")
        return "char", ord(e)

    def char_class(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        self.i += 1  # '['
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        shorthand, first = False, True
        while not (self.peek() == "]" and not first):
            first = False
            kind, lo = self.class_item()
            if kind == "set":
                ranges += lo
                shorthand = True
                continue
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                kind, hi = self.class_item()
                if kind == "set":
                    self.fail("a range that ends in a class escape")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        self.i += 1  # ']'
        if negate:
            # The shorthands are exact within printable ASCII only: outside it, the complement
            # of their ASCII part would take in characters Python counts as digits or spaces.
            matched = _minus(_ASCII if shorthand else _ALL, ranges)
        else:
            matched = _norm(ranges)
        allowed = _minus(matched, _UNSAFE)
        if not allowed:
            self.fail("a character class with no character a JSON string holds unescaped")
        return allowed, matched

    def class_item(self) -> tuple[str, Any]:
        if self.peek() == "\\":
            return self.escape(in_class=True)
        self.i += 1
        return "char", ord(self.src[self.i - 1])


def _anchors(node: tuple) -> tuple[bool, bool]:
    """Whether a '^' or '$' stands inside ``node`` (a group, say)."""
    if node[0] == "group":
        return _anchors(node[1])
    if node[0] == "alt":
        flags = [_anchors(b) for b in node[1]]
        return any(f[0] for f in flags), any(f[1] for f in flags)
    if node[0] == "seq":
        return node[2], node[3]
    return False, False
