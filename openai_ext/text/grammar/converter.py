"""GBNF from prepared schemas: the project's own converter, in pure Python.

``rewrite.prepare`` has already brought every schema into a few plain shapes (see ``_Writer.rule``),
so this only writes grammar: no keyword is ever ignored here, because none reaches it unhandled.
It needs nothing but the standard library: in extension mode the web UI applies the grammar text
with its own loaders (llama.cpp, or its Transformers grammar), and llama-cpp-python need not be
installed there.

What the grammar allows, on purpose:
- whitespace is bounded: at most one space between tokens of the JSON, so a small model cannot
  loop on blanks;
- strings hold no raw control characters (JSON forbids them), and no ``\\u`` escape of a UTF-16
  surrogate (a pair decodes to one character, which would make a string shorter than the
  ``minLength`` the grammar counted);
- numbers have at most 16 digits on each side of the point;
- repetitions are written out (``a a (a (a)?)?``), never ``{m,n}``: the web UI's Transformers
  grammar does not read that syntax.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import SchemaNotSupported
from .patterns import gbnf_literal
from .rewrite import prepare

_HEX = "[0-9a-fA-F]"
_DIGITS15 = " ".join(["([0-9]"] * 15) + ")?" * 15     # up to 15 more digits

# The JSON building blocks, each a rule named j-*, added to a grammar only when used.
_PRIMITIVES: dict[str, tuple[str, list[str]]] = {
    "j-ws": ('" "?', []),
    "j-char": (r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] ' + f"{_HEX} {_HEX} {_HEX}"
               + f" | [dD] [0-7] {_HEX} {_HEX}))", []),
    "j-string": (r'"\"" j-char* "\"" j-ws', ["j-char", "j-ws"]),
    "j-int-part": (f'"0" | [1-9] {_DIGITS15}', []),
    "j-integer": ('"-"? j-int-part j-ws', ["j-int-part", "j-ws"]),
    "j-number": (f'"-"? j-int-part ("." [0-9] {_DIGITS15})? ([eE] [-+]? j-int-part)? j-ws', ["j-int-part", "j-ws"]),
    "j-boolean": ('("true" | "false") j-ws', ["j-ws"]),
    "j-null": ('"null" j-ws', ["j-ws"]),
    "j-value": ("j-object | j-array | j-string | j-number | j-boolean | j-null",
                ["j-object", "j-array", "j-string", "j-number", "j-boolean", "j-null"]),
    "j-object": ('"{" j-ws (j-string ":" j-ws j-value ("," j-ws j-string ":" j-ws j-value)*)? "}" j-ws',
                 ["j-ws", "j-string", "j-value"]),
    "j-array": ('"[" j-ws (j-value ("," j-ws j-value)*)? "]" j-ws', ["j-ws", "j-value"]),
    # formats, as the strings' JSON text (their characters need no escape)
    "j-date": ('[0-9] [0-9] [0-9] [0-9] "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])', []),
    "j-time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9] [0-9] [0-9])? '
               '("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])', []),
    "j-date-time": ('j-date "T" j-time', ["j-date", "j-time"]),
    "j-uuid": (" ".join([_HEX] * 8) + ' "-" ' + ' "-" '.join(" ".join([_HEX] * 4) for _ in range(3))
               + ' "-" ' + " ".join([_HEX] * 12), []),
}
_NAME = re.compile(r"[^a-zA-Z0-9-]+")


def repeat(item: str, lo: int, hi: int | None, *, sep: str = "", lead: bool = False) -> str:
    """``item`` lo to hi times (None: no limit), written out; ``sep`` goes between two items,
    and before the first one too when ``lead`` (something came before)."""
    first = f"{sep} {item}" if (sep and lead) else item
    more = f"{sep} {item}" if sep else item
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


class _Writer:
    def __init__(self, defs: dict[str, Any]):
        self.defs = defs
        self.rules: dict[str, str] = {}
        self._refs: dict[str, str] = {}

    def use(self, name: str) -> str:
        if name not in self.rules:
            body, deps = _PRIMITIVES[name]
            self.rules[name] = body
            for dep in deps:
                self.use(dep)
        return name

    def add(self, name: str, body: str) -> str:
        self.rules[name] = body
        return name

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.rules or name in _PRIMITIVES:
            name, i = f"{base}{i}", i + 1
        return name

    def named(self, schema: Any, name: str) -> str:
        """A rule called ``name`` for ``schema``."""
        self.rules[name] = ""          # reserved while its parts are written
        self.rules[name] = self.rule(schema, name)
        return name

    def ref(self, ref: str) -> str:
        name = self._refs.get(ref)
        if name is None:
            target = ref.removeprefix("#/$defs/")
            if target not in self.defs:
                raise KeyError(ref)
            name = self._refs[ref] = self.fresh("ref-" + (_NAME.sub("-", target).strip("-") or "def"))
            self.named(self.defs[target], name)
        return name

    def sub(self, schema: Any, name: str) -> str:
        """An expression for ``schema``: a primitive or a reference as it is, anything else as
        a rule of its own named after where it sits."""
        expr = self.rule(schema, name)
        if re.fullmatch(r"[a-zA-Z0-9-]+", expr):
            return expr
        return self.add(self.fresh(name), expr)

    def literal(self, value: Any) -> str:
        # no blank after a constant: nothing would gain from one, and a small model takes it
        return gbnf_literal(json.dumps(value, ensure_ascii=False))

    def rule(self, s: dict[str, Any], name: str) -> str:
        """The grammar expression of one prepared shape."""
        if "$ref" in s:
            return self.ref(s["$ref"])
        if "anyOf" in s:
            return " | ".join(self.sub(b, f"{name}-{i}") for i, b in enumerate(s["anyOf"]))
        if "const" in s:
            return self.literal(s["const"])
        if "enum" in s:
            return " | ".join(self.literal(v) for v in s["enum"])
        kind = s.get("type")
        if kind is None:
            return self.use("j-value")
        if kind in ("null", "boolean", "integer", "number"):
            return self.use(f"j-{kind}")
        if kind == "string":
            return self._string(s)
        if kind == "array":
            return self._array(s, name)
        if kind == "object":
            return self._object(s, name)
        raise ValueError(f"unexpected schema shape {s!r}")

    def _string(self, s: dict[str, Any]) -> str:
        ws = self.use("j-ws")
        if "x-pattern" in s:
            return f'"\\"" ({s["x-pattern"]}) "\\"" {ws}'
        if "format" in s:
            return f'"\\"" {self.use("j-" + s["format"])} "\\"" {ws}'
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        if not lo and hi is None:
            return self.use("j-string")
        return f'"\\"" {repeat(self.use("j-char"), lo, hi)} "\\"" {ws}'

    def _array(self, s: dict[str, Any], name: str) -> str:
        ws = self.use("j-ws")
        spec = s.get("x-array")
        if spec is None:
            return self.use("j-array")
        sep = f'"," {ws}'
        parts = [self.sub(item, f"{name}-t{i}") for i, item in enumerate(spec["prefix"])]
        body = f" {sep} ".join(parts)
        if spec["max"] != 0:
            item = self.sub(spec["item"], f"{name}-i") if spec["item"] else self.use("j-value")
            more = repeat(item, spec["min"], spec["max"], sep=sep, lead=bool(parts))
            body = f"{body} {more}" if body else more
        return f'"[" {ws} {body} "]" {ws}' if body else f'"[" {ws} "]" {ws}'

    def _object(self, s: dict[str, Any], name: str) -> str:
        ws = self.use("j-ws")
        props = s.get("properties")
        if props is None:
            extra = s.get("additionalProperties")
            if extra is None:
                return self.use("j-object")
            pair = f'{self.use("j-string")} ":" {ws} {self.sub(extra, f"{name}-v")}'
            return f'"{{" {ws} ({pair} ("," {ws} {pair})*)? "}}" {ws}'
        if not props:
            return f'"{{" {ws} "}}" {ws}'
        required = set(s.get("required") or [])
        pairs = []
        for key, sub in props.items():
            value = self.sub(sub, f"{name}-{_NAME.sub('-', key).strip('-') or 'p'}")
            pairs.append((f'{gbnf_literal(json.dumps(key, ensure_ascii=False))} {ws} ":" {ws} {value}',
                          key in required))
        # Properties come in the schema's order and optional ones may be left out. Once a pair is
        # written, each later one starts with a comma (``tail``); the first written has none.
        # ``start`` is what may come while nothing is written, built from the last property
        # back. Tails and the "skip this one" alternatives are rules, so the grammar grows
        # linearly with the properties.
        tails: dict[int, str] = {}

        def tail(k: int) -> str:
            if k == len(pairs):
                return ""
            if k not in tails:
                pair, req = pairs[k]
                piece = f'"," {ws} {pair}' if req else f'("," {ws} {pair})?'
                rest = tail(k + 1)
                body = f"{piece} {rest}" if rest else piece
                tails[k] = body if len(pairs) - k <= 2 else self.add(self.fresh(f"{name}-after{k}"), body)
            return tails[k]

        start = ""
        for k in range(len(pairs) - 1, -1, -1):
            pair, req = pairs[k]
            rest = tail(k + 1)
            first = f"{pair} {rest}" if rest else pair
            if req:
                start = first
            elif start:
                start = f"({first} | {self.add(self.fresh(f'{name}-from{k + 1}'), start)})"
            else:
                start = f"({first})?"
        return f'"{{" {ws} {start} "}}" {ws}'


def gbnf(rules: dict[str, Any], defs: dict[str, Any], *, where: str) -> str:
    """GBNF in which each name of ``rules`` is a rule for its prepared schema ("" is root)."""
    writer = _Writer(defs)
    try:
        for name, schema in rules.items():
            writer.named(schema, name or "root")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise SchemaNotSupported(f"{where} cannot be turned into a grammar: {e}", param=where) from None
    return "\n".join(f"{name} ::= {body}" for name, body in writer.rules.items())


def schema_to_gbnf(schema: Any, *, where: str, strict: bool = True) -> str:
    """The GBNF grammar for ``schema``; its top rule is ``root`` (``strict``: see prepare)."""
    prepared = prepare(schema, where, strict=strict)
    return gbnf({"root": prepared.schema}, prepared.defs, where=where)


JSON_OBJECT_SCHEMA = {"type": "object"}
