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
- numbers have at most 16 digits on each side of the point; with minimum/maximum they are
  written digit by digit within the range (see numbers), without an exponent;
- repetitions are never ``{m,n}`` (the web UI's Transformers grammar does not read that syntax):
  a few are written out (``a a (a (a)?)?``), more are counted in binary (see repeat);
- an enum of more than a few values is written as a tree of its texts' common beginnings, so
  the engine follows one alternative at a time however many values there are.

Every rule drawn counts against the request's ``limits.Budget`` (``OverBudget`` past it), and so
does following more alternatives at once than MAX_LIVE: the grammar stays one llama.cpp parses in
milliseconds and samples with a few stacks.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import SchemaNotSupported
from .limits import MAX_LIVE, Budget, OverBudget
from .patterns import gbnf_literal
from .repeat import repeat
from .rewrite import loose, prepare

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


_SMALL_ENUM = 8     # enums written as plain alternatives; larger ones as a tree


class _Writer:
    def __init__(self, defs: dict[str, Any], budget: Budget):
        self.defs = defs
        self.budget = budget
        self.rules: dict[str, str] = {}
        self._refs: dict[str, str] = {}
        self._width: dict[str, int] = {}   # rule -> alternatives it may follow at once
        self.width = 1                     # that of the expression rule() wrote last

    def use(self, name: str) -> str:
        if name not in self.rules:
            body, deps = _PRIMITIVES[name]
            self.add(name, body)
            for dep in deps:
                self.use(dep)
        return name

    def add(self, name: str, body: str) -> str:
        old = self.rules.get(name)
        if old is not None:
            self.budget.give_back(old)
        self.budget.grammar(body)
        self.rules[name] = body
        return name

    def mark(self) -> int:
        return len(self.rules)

    def rollback(self, mark: int) -> None:
        """Takes out every rule written since ``mark`` (a schema that is relaxed instead)."""
        for name in list(self.rules)[mark:]:
            self.budget.give_back(self.rules.pop(name))
            self._width.pop(name, None)
        self._refs = {k: v for k, v in self._refs.items() if v in self.rules}

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.rules or name in _PRIMITIVES:
            name, i = f"{base}{i}", i + 1
        return name

    def named(self, schema: Any, name: str) -> str:
        """A rule called ``name`` for ``schema``."""
        self.add(name, "")          # reserved while its parts are written
        self.add(name, self.rule(schema, name))
        self._width[name] = self.width
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
        if not re.fullmatch(r"[a-zA-Z0-9-]+", expr):
            expr = self.add(self.fresh(name), expr)
        self._width.setdefault(expr, self.width)
        return expr

    def _widest(self, names: list[str]) -> int:
        return max((self._width.get(n, 1) for n in names), default=1)

    def literal(self, value: Any) -> str:
        # no blank after a constant: nothing would gain from one, and a small model takes it
        return gbnf_literal(json.dumps(value, ensure_ascii=False))

    def rule(self, s: dict[str, Any], name: str) -> str:
        """The grammar expression of one prepared shape (its width goes to ``self.width``)."""
        self.width = 1
        if "$ref" in s:
            ref = self.ref(s["$ref"])
            self.width = self._width.get(ref, 1)   # 1 while the reference is being written
            return ref
        if "anyOf" in s:
            branches = [self.sub(b, f"{name}-{i}") for i, b in enumerate(s["anyOf"])]
            self.width = sum(self._width.get(b, 1) for b in branches)
            if self.width > MAX_LIVE:
                raise OverBudget(f"more than {MAX_LIVE} alternatives followed at once (nested anyOf)")
            return " | ".join(branches)
        if "const" in s:
            return self.literal(s["const"])
        if "enum" in s:
            if len(s["enum"]) <= _SMALL_ENUM:
                return " | ".join(self.literal(v) for v in s["enum"])
            texts = dict.fromkeys(json.dumps(v, ensure_ascii=False) for v in s["enum"])
            return self.tree([(t, "") for t in texts], name)
        kind = s.get("type")
        if kind is None:
            return self.use("j-value")
        if "x-range" in s:
            return f'{s["x-range"]} {self.use("j-ws")}'
        if kind in ("null", "boolean", "integer", "number"):
            return self.use(f"j-{kind}")
        if kind == "string":
            return self._string(s)
        if kind == "array":
            return self._array(s, name)
        if kind == "object":
            return self._object(s, name)
        raise ValueError(f"unexpected schema shape {s!r}")

    def tree(self, items: list[tuple[str, str]], name: str) -> str:
        """Each text followed by its tail, written as a tree of the texts' common beginnings:
        each rule's alternatives start with different characters, so however many texts there
        are, one is followed at a time. No text may be another's beginning with a tail."""
        root: dict[str, Any] = {}
        for text, tail in items:
            node = root
            for ch in text:
                node = node.setdefault(ch, {})
            node[""] = tail                    # a text ends here
        todo: list[tuple[dict[str, Any], str | None]] = [(root, None)]
        top = ""
        while todo:
            node, rule_name = todo.pop()
            alts = []
            for ch in sorted(k for k in node if k):
                label, child = ch, node[ch]
                while len(child) == 1 and "" not in child:   # a run without branches: one literal
                    (nxt, child), = child.items()
                    label += nxt
                if list(child) == [""]:
                    alts.append(f"{gbnf_literal(label)} {child['']}".strip())
                else:
                    child_rule = self.add(self.fresh(f"{name}-t"), "")
                    todo.append((child, child_rule))
                    alts.append(f"{gbnf_literal(label)} {child_rule}")
            if "" in node:
                alts.append(node[""] or '""')
            body = " | ".join(alts)
            if rule_name is None:
                top = body
            else:
                self.add(rule_name, body)
        return top

    def _string(self, s: dict[str, Any]) -> str:
        ws = self.use("j-ws")
        if "x-pattern" in s:
            return f'"\\"" ({s["x-pattern"].gbnf(self)}) "\\"" {ws}'
        if "format" in s:
            return f'"\\"" {self.use("j-" + s["format"])} "\\"" {ws}'
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        if not lo and hi is None:
            return self.use("j-string")
        return f'"\\"" {repeat(self.use("j-char"), lo, hi, rules=self, base="chars")} "\\"" {ws}'

    def _array(self, s: dict[str, Any], name: str) -> str:
        ws = self.use("j-ws")
        spec = s.get("x-array")
        if spec is None:
            return self.use("j-array")
        sep = f'"," {ws}'
        parts = [self.sub(item, f"{name}-t{i}") for i, item in enumerate(spec["prefix"])]
        body = f" {sep} ".join(parts)
        used = list(parts)
        if spec["max"] != 0:
            item = self.sub(spec["item"], f"{name}-i") if spec["item"] else self.use("j-value")
            used.append(item)
            more = repeat(item, spec["min"], spec["max"], sep=sep, lead=bool(parts), rules=self, base=f"{name}-items")
            body = f"{body} {more}" if body else more
        self.width = self._widest(used)
        return f'"[" {ws} {body} "]" {ws}' if body else f'"[" {ws} "]" {ws}'

    def _object(self, s: dict[str, Any], name: str) -> str:
        ws = self.use("j-ws")
        props = s.get("properties")
        if props is None:
            extra = s.get("additionalProperties")
            if extra is None:
                return self.use("j-object")
            value = self.sub(extra, f"{name}-v")
            self.width = self._widest([value])
            pair = f'{self.use("j-string")} ":" {ws} {value}'
            return f'"{{" {ws} ({pair} ("," {ws} {pair})*)? "}}" {ws}'
        if not props:
            return f'"{{" {ws} "}}" {ws}'
        required = set(s.get("required") or [])
        pairs, values = [], []
        for key, sub in props.items():
            value = self.sub(sub, f"{name}-{_NAME.sub('-', key).strip('-') or 'p'}")
            values.append(value)
            pairs.append((f'{gbnf_literal(json.dumps(key, ensure_ascii=False))} {ws} ":" {ws} {value}',
                          key in required))
        width = self._widest(values)
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
        self.width = width
        return f'"{{" {ws} {start} "}}" {ws}'


class Grammar:
    """A grammar being written from prepared schemas, one schema at a time, within a budget."""

    def __init__(self, budget: Budget | None = None):
        self.budget = budget or Budget()
        self._writer = _Writer({}, self.budget)

    def write(self, name: str, schema: Any, defs: dict[str, Any], *, where: str) -> None:
        """Rule ``name`` for a prepared schema. Over the budget (``OverBudget``), the rules it
        drew are taken out again, so the caller may write the schema relaxed instead."""
        writer = self._writer
        writer.defs = {**writer.defs, **defs}
        mark = writer.mark()
        try:
            writer.named(schema, name)
        except RecursionError:
            writer.rollback(mark)
            raise OverBudget("rules nested too deeply") from None
        except OverBudget:
            writer.rollback(mark)
            raise
        except (ValueError, KeyError, TypeError) as e:
            writer.rollback(mark)
            raise SchemaNotSupported(f"{where} cannot be turned into a grammar: {e}", param=where) from None

    def use(self, name: str) -> str:
        """One of the JSON building blocks (j-ws, j-value ...), added if not yet there."""
        return self._writer.use(name)

    def tree(self, name: str, items: list[tuple[str, str]]) -> None:
        """Rule ``name``: each text followed by its tail (see _Writer.tree)."""
        self._writer.add(name, "")
        self._writer.add(name, self._writer.tree(items, name))

    def text(self) -> str:
        return "\n".join(f"{name} ::= {body}" for name, body in self._writer.rules.items())


def write_schema(g: Grammar, name: str, schema: Any, where: str, *, strict: bool, prefix: str = "",
                 checked: bool = False):
    """Prepares ``schema`` and writes it as rule ``name`` of ``g``; returns the Prepared. A strict
    schema beyond the limits is a 400 naming ``where``; any other is written relaxed instead."""
    prepared = prepare(schema, where, prefix=prefix, strict=strict, budget=g.budget, checked=checked)
    try:
        g.write(name, prepared.schema, prepared.defs, where=where)
    except OverBudget as e:
        if strict:
            raise SchemaNotSupported(f"{where} needs {e} to be turned into a grammar; this server's limits keep "
                                     "any schema quick to enforce (see the README).", param=where) from None
        prepared = loose(schema, where)
        g.write(name, prepared.schema, prepared.defs, where=where)
    return prepared


def schema_to_gbnf(schema: Any, *, where: str, strict: bool = True) -> str:
    """The GBNF grammar for ``schema``; its top rule is ``root`` (``strict``: see prepare)."""
    g = Grammar()
    write_schema(g, "root", schema, where, strict=strict)
    return g.text()


JSON_OBJECT_SCHEMA = {"type": "object"}
