"""GBNF from prepared schemas, with llama.cpp's own JSON-schema converter.

The converter ships with llama-cpp-python as a pure-Python module (``llama_cpp/llama_grammar.py``,
llama.cpp's json_schema_to_grammar). It is loaded by file path, so the llama.cpp library itself is
not loaded: in extension mode only the grammar text is needed, and the web UI applies it. Patterns,
arrays and literals get rules of our own: the converter's would let a pattern break the JSON string
it sits in, ignore the bounds of tuples, and garble literals that hold a backslash.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType
from typing import Any

from ...core.errors import InvalidRequestError
from .errors import SchemaNotSupported
from .patterns import gbnf_literal
from .rewrite import prepare


@functools.cache
def _converter_module() -> ModuleType | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = f"{next(iter(spec.submodule_search_locations))}/llama_grammar.py"
    mod_spec = importlib.util.spec_from_file_location("openai_ext._llama_grammar", path)
    if mod_spec is None or mod_spec.loader is None:
        return None
    module = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(module)
    except (OSError, SyntaxError):
        return None
    # This converter's string character rule lets raw control characters (a newline, say) into
    # strings, which JSON forbids; llama.cpp's current converter excludes them, and so does ours.
    # \u escapes of UTF-16 surrogates are left out too: a pair decodes to one character, which
    # would make a string shorter than the minLength the grammar counted.
    # (Repetitions are written out: the web UI's Transformers grammar knows no {m,n}.)
    hex_ = "[0-9a-fA-F]"
    module.PRIMITIVE_RULES["char"] = module.BuiltinRule(
        r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] ' + f"{hex_} {hex_} {hex_}"
        + f" | [dD] [0-7] {hex_} {hex_}))", [])
    return module


def available() -> bool:
    return _converter_module() is not None


@functools.cache
def _converter_class(module: ModuleType) -> type:
    class Converter(module.SchemaConverter):
        """llama.cpp's converter, fed prepared schemas, with three rules of our own: patterns,
        arrays, and literals escaped in full (its own escaping breaks on '\\')."""

        def __init__(self, defs: dict[str, Any]):
            super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
            self._refs = {f"#/$defs/{name}": schema for name, schema in defs.items()}
            self._ref_rules: dict[str, str] = {}

        def _format_literal(self, literal: str) -> str:
            return gbnf_literal(literal)

        def _resolve_ref(self, ref: str) -> str:
            # A rule of its own for each definition (the converter names them by the last part
            # of the path only, so two definitions of the same name would share one rule).
            name = self._ref_rules.get(ref)
            if name is None:
                base = "ref-" + module.INVALID_RULE_CHARS_RE.sub("-", ref.rsplit("/", 1)[-1])
                name, i = base, 1
                while name in self._rules or name in self._ref_rules.values():
                    name, i = f"{base}{i}", i + 1
                self._ref_rules[ref] = name
                self.named(self._refs[ref], name)
            return name

        def named(self, schema: Any, name: str) -> str:
            """Visits ``schema`` so that a rule called ``name`` stands for it."""
            got = self.visit(schema, "" if name == "root" else name)
            if got != name:
                self._add_rule(name, got)
            return name

        def visit(self, schema: Any, name: str) -> str:
            rule_name = name + "-" if name in module.RESERVED_NAMES else name or "root"
            if "x-pattern" in schema:
                return self._add_rule(rule_name, f'"\\"" {schema["x-pattern"]} "\\"" space')
            if "x-array" in schema:
                return self._add_rule(rule_name, self._array(schema["x-array"], name))
            return super().visit(schema, name)

        def _array(self, spec: dict[str, Any], name: str) -> str:
            sub = f"{name}{'-' if name else ''}"
            head = [self.visit(s, f"{sub}tuple-{i}") for i, s in enumerate(spec["prefix"])]
            body = ' "," space '.join(head)
            if spec["max"] != 0:
                item = self.visit(spec["item"], f"{sub}item")
                if head:
                    more = module._build_repetition(f'("," space {item})', spec["min"], spec["max"])
                else:
                    more = module._build_repetition(item, spec["min"], spec["max"], separator_rule='"," space')
                body = f"{body} {more}".strip()
            return f'"[" space {body} "]" space'

    return Converter


def _require_converter(where: str) -> ModuleType:
    module = _converter_module()
    if module is None:
        raise InvalidRequestError(
            "Structured output needs llama.cpp's JSON-schema converter, which comes with llama-cpp-python: "
            "pip install llama-cpp-python (in the web UI's environment).", param=where)
    return module


def gbnf(rules: dict[str, Any], defs: dict[str, Any], *, where: str) -> str:
    """GBNF in which each name of ``rules`` is a rule for its prepared schema ("" is root)."""
    converter = _converter_class(_require_converter(where))(defs)
    try:
        for name, schema in rules.items():
            converter.named(schema, name or "root")
        return converter.format_grammar()
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise SchemaNotSupported(f"{where} cannot be turned into a grammar: {e}", param=where) from None


def schema_to_gbnf(schema: Any, *, where: str, strict: bool = True) -> str:
    """The GBNF grammar for ``schema``; its top rule is ``root`` (``strict``: see prepare)."""
    _require_converter(where)
    prepared = prepare(schema, where, strict=strict)
    return gbnf({"root": prepared.schema}, prepared.defs, where=where)


JSON_OBJECT_SCHEMA = {"type": "object"}
