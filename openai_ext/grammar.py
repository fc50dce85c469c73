"""JSON Schema to GBNF grammar, with llama.cpp's own converter.

The converter ships with llama-cpp-python as a pure-Python module (``llama_cpp/llama_grammar.py``,
llama.cpp's json_schema_to_grammar). It is loaded by file path, so the llama.cpp library itself is
not loaded: in extension mode only the grammar text is needed, and the web UI applies it.

The converter silently ignores keywords it does not implement. A grammar that ignored, say,
``minimum`` could produce output that fails the schema, so every keyword is checked first and an
unsupported one gets a 400 that names where it is.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from types import ModuleType
from typing import Any

from .errors import InvalidRequestError

# Keywords the converter turns into grammar rules.
_ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
             "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "pattern", "minLength",
             "maxLength", "format"}
# Keywords that describe and do not constrain, or that only hold definitions.
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated",
                "readOnly", "writeOnly", "$defs", "definitions", "strict", "contentMediaType",
                "contentEncoding"}
# Formats with a grammar of their own; other formats are annotations in JSON Schema 2020-12.
_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


class SchemaNotSupported(InvalidRequestError):
    pass


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
    module.PRIMITIVE_RULES["char"] = module.BuiltinRule(
        r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})', [])
    return module


def available() -> bool:
    return _converter_module() is not None


def check_supported(schema: Any, where: str) -> None:
    """Raises a 400 naming the first part of ``schema`` the grammar could not enforce."""
    if isinstance(schema, bool):
        if schema is False:
            raise SchemaNotSupported(f"{where} is the schema false, which no output can satisfy.", param=where)
        return
    if not isinstance(schema, dict):
        raise SchemaNotSupported(f"{where} must be a JSON Schema object.", param=where)
    for key, value in schema.items():
        here = f"{where}.{key}"
        if key in _ANNOTATIONS:
            if key in ("$defs", "definitions") and isinstance(value, dict):
                for name, sub in value.items():
                    check_supported(sub, f"{here}.{name}")
            continue
        if key not in _ENFORCED:
            raise SchemaNotSupported(
                f"{here}: the keyword '{key}' cannot be enforced while generating. Remove it from the schema "
                f"(supported: {', '.join(sorted(_ENFORCED))}).", param=here)
        if key == "type":
            kinds = value if isinstance(value, list) else [value]
            bad = [k for k in kinds if k not in _TYPES]
            if bad:
                raise SchemaNotSupported(f"{here}: unknown type {bad[0]!r}.", param=here)
        elif key == "properties":
            if not isinstance(value, dict):
                raise SchemaNotSupported(f"{here} must be an object.", param=here)
            for name, sub in value.items():
                check_supported(sub, f"{here}.{name}")
        elif key in ("items", "additionalProperties") and isinstance(value, (dict, bool)):
            if key == "items" or isinstance(value, dict):
                check_supported(value, here)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                raise SchemaNotSupported(f"{here} must be a non-empty list of schemas.", param=here)
            for i, sub in enumerate(value):
                check_supported(sub, f"{here}[{i}]")
            if key == "allOf" and not all(isinstance(s, dict) and ("properties" in s or "$ref" in s) for s in value):
                raise SchemaNotSupported(f"{here}: allOf is supported only for merging object properties.",
                                         param=here)
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            raise SchemaNotSupported(f"{here}: only local references (#/...) are supported.", param=here)


def schema_to_gbnf(schema: Any, *, where: str, rule: str = "") -> str:
    """The GBNF grammar for ``schema``; its top rule is ``root``, or ``rule`` when given."""
    module = _converter_module()
    if module is None:
        raise InvalidRequestError(
            "Structured output needs llama.cpp's JSON-schema converter, which comes with llama-cpp-python: "
            "pip install llama-cpp-python (in the web UI's environment).", param=where)
    check_supported(schema, where)
    schema = _anchor_patterns(json.loads(json.dumps(schema)))
    converter = module.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        schema = converter.resolve_refs(schema, "request")
        converter.visit(schema, rule)
        return converter.format_grammar()
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise SchemaNotSupported(f"{where} cannot be turned into a grammar: {e}", param=where) from None


def _anchor_patterns(node: Any) -> Any:
    """JSON Schema patterns match anywhere; the converter wants ^...$. Any string matching the
    anchored form also matches the original, so anchoring keeps outputs valid."""
    if isinstance(node, dict):
        out = {k: _anchor_patterns(v) for k, v in node.items()}
        pattern = out.get("pattern")
        if isinstance(pattern, str) and not (pattern.startswith("^") and pattern.endswith("$")):
            core = pattern.removeprefix("^").removesuffix("$")
            out["pattern"] = f"^({core})$"
        return out
    if isinstance(node, list):
        return [_anchor_patterns(v) for v in node]
    return node


JSON_OBJECT_SCHEMA = {"type": "object"}
