"""Regular expressions (a schema's ``pattern``) as GBNF for the JSON text of matching strings.

A pattern constrains the decoded string; the grammar writes its JSON text. Literal characters
are written with their JSON escapes. Character classes and '.' keep only characters a JSON
string holds unescaped (no '"', '\\' or control characters): fewer strings, all matching.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import SchemaNotSupported

MAX_REPEAT = 1000        # llama.cpp writes out every repetition of a {m,n} as a rule


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
_SAFE = _minus([(0, 0x10FFFF)], _UNSAFE)
_ASCII = [(0x20, 0x7E)]
_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [(0x20, 0x20)]
# Python's \d, \w and \s match more than ASCII, so these are their ASCII parts (exact within
# printable ASCII), and the negated ones stay within printable ASCII.
_SHORTHANDS = {"d": _DIGIT, "w": _WORD, "s": _SPACE, "D": _minus(_ASCII, _DIGIT), "W": _minus(_ASCII, _WORD),
               "S": _minus(_ASCII, _SPACE)}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


def _repeat(item: str, lo: int, hi: int | None) -> str:
    """``item`` lo to hi times (None: no limit), written out as llama.cpp would expand {lo,hi}."""
    if (lo, hi) in ((0, None), (1, None), (0, 1)):
        return item + {(0, None): "*", (1, None): "+", (0, 1): "?"}[(lo, hi)]
    out = [item] * lo
    if hi is None:
        out.append(item + "*")
    else:
        optional = ""
        for _ in range(hi - lo):
            optional = f"({item} {optional})?" if optional else f"({item})?"
        out.append(optional)
    return " ".join(filter(None, out)) or '""'


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


@dataclass
class _Frag:
    gbnf: str
    text: str | None = None     # a literal character's JSON text, to be merged with its neighbours
    caret: bool = False         # holds a ^ (so it must not repeat)
    dollar: bool = False        # ends with a $ (so nothing may follow)


def pattern_gbnf(pattern: Any, where: str) -> str:
    """GBNF for the JSON text (between the quotes) of strings that match ``pattern``."""
    if not isinstance(pattern, str):
        raise SchemaNotSupported(f"{where} must be a string.", param=where)
    try:
        re.compile(pattern)
    except re.error as e:
        raise SchemaNotSupported(f"{where}: {pattern!r} is not a valid regular expression ({e}).",
                                 param=where) from None
    return _Pattern(pattern, where).translate()


class _Pattern:
    """Regular expressions of the usual kind: literals, escapes, classes, '.', groups, '|',
    quantifiers, and ^/$ where they hold trivially. Outputs match in full, so they match as
    JSON Schema asks (anywhere in the string) too."""

    def __init__(self, src: str, where: str):
        self.src, self.where, self.i = src, where, 0

    def fail(self, what: str):
        raise SchemaNotSupported(f"{self.where}: {what} in the pattern {self.src!r} cannot be enforced while "
                                 "generating; rewrite the pattern without it.", param=self.where)

    def peek(self, k: int = 0) -> str:
        return self.src[self.i + k] if self.i + k < len(self.src) else ""

    def translate(self) -> str:
        frag = self.alternation(at_start=True)
        if self.i != len(self.src):  # re.compile accepted it, so this is an unbalanced ')'
            self.fail("an unbalanced ')'")
        return frag.gbnf

    def alternation(self, at_start: bool) -> _Frag:
        branches = [self.sequence(at_start)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence(at_start))
        if len(branches) == 1:
            return branches[0]
        return _Frag("(" + " | ".join(b.gbnf for b in branches) + ")", caret=any(b.caret for b in branches),
                     dollar=any(b.dollar for b in branches))

    def sequence(self, at_start: bool) -> _Frag:
        parts: list[str] = []
        text = ""
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
                if not at_start or parts or text:
                    self.fail("'^' after the start")
                caret = True
                continue
            frag = self.atom(at_start and not parts and not text)
            quantifier = self.quantifier()
            if quantifier and (frag.caret or frag.dollar):
                self.fail("a repeated '^' or '$'")
            caret, dollar = caret or frag.caret, dollar or frag.dollar
            if frag.text is not None and not quantifier:
                text += frag.text
                continue
            if text:
                parts.append(gbnf_literal(text))
                text = ""
            parts.append(_repeat(f"({frag.gbnf})", *quantifier) if quantifier else frag.gbnf)
        if text:
            parts.append(gbnf_literal(text))
        return _Frag(" ".join(parts) or '""', caret=caret, dollar=dollar)

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
            if max(lo, hi or 0) > MAX_REPEAT:
                self.fail(f"a repeat count above {MAX_REPEAT}")
            self.i = m.end()
            q = (lo, hi)
        else:
            return None
        if self.peek() == "?":
            self.i += 1  # lazy: the same strings match
        elif self.peek() == "+":
            self.fail("a possessive quantifier")
        return q

    def atom(self, at_start: bool) -> _Frag:
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
            inner = self.alternation(at_start)
            self.i += 1  # ')'
            return _Frag(f"({inner.gbnf})", caret=inner.caret, dollar=inner.dollar)
        if c == "[":
            return _Frag(self.char_class())
        if c == ".":
            self.i += 1
            return _Frag(_gbnf_class(_SAFE))
        if c == "\\":
            kind, value = self.escape(in_class=False)
            if kind == "set":
                return _Frag(_gbnf_class(_minus(value, _UNSAFE)))
            return self.literal(value)
        self.i += 1
        return self.literal(ord(c))

    def literal(self, cp: int) -> _Frag:
        text = json.dumps(chr(cp), ensure_ascii=False)[1:-1]  # as the JSON string writes it
        return _Frag(gbnf_literal(text), text=text)

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

    def char_class(self) -> str:
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
            allowed = _minus(_minus(_ASCII, _UNSAFE) if shorthand else _SAFE, ranges)
        else:
            allowed = _minus(ranges, _UNSAFE)
        if not allowed:
            self.fail("a character class with no character a JSON string holds unescaped")
        return _gbnf_class(allowed)

    def class_item(self) -> tuple[str, Any]:
        if self.peek() == "\\":
            return self.escape(in_class=True)
        self.i += 1
        return "char", ord(self.src[self.i - 1])
