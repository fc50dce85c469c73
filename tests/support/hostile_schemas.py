"""Schemas that once took the server down or held it: each is answered within counted work
(schema nodes, grammar rules and bytes), with a 400 naming where (strict) or a relaxed grammar."""

from __future__ import annotations

from openai_ext.text.grammar.errors import MAX_SCHEMA_NODES


def _deep_optional(levels):
    s = {"type": "string"}
    for i in range(levels):
        s = {"type": "object", "properties": {f"a{i}": s, f"b{i}": {"type": "integer"}, f"c{i}": {"type": ["string", "null"]}}}
    return s


def _ref_bomb(n):
    """Each definition refers twice to the next, with a sibling keyword, so merging the references
    in would copy 2^n nodes."""
    defs = {f"D{i}": {"type": "object", "properties": {side: {"$ref": f"#/$defs/D{i + 1}", "type": "object"}
                                                        for side in ("l", "r")}} for i in range(n)}
    return {"$defs": {**defs, f"D{n}": {"type": "object"}}, "$ref": "#/$defs/D0", "type": "object"}


HOSTILE = {
    "huge maxLength": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 524288}}},
    "huge minLength and maxItems": {"type": "array", "minItems": 10**9, "items": {"type": "string", "minLength": 10**9}},
    "deep optional nesting": _deep_optional(20),
    "many alternatives": {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(1000)]},
    "alternatives inside alternatives": {"anyOf": [{"type": "object", "properties": {"a": {"$ref": "#/$defs/In"}}}
                                                   for _ in range(60)],
                                         "$defs": {"In": {"anyOf": [{"type": "object", "properties": {"b": {"const": j}}}
                                                                    for j in range(60)]}}},
    "huge enum": {"enum": [f"value-{i}" for i in range(200_000)]},
    "long enum texts": {"enum": ["x" * 40_000, "y" * 40_000]},
    "nested huge bounds": {"type": "array", "maxItems": 10**6, "items": {
        "type": "array", "minItems": 3, "maxItems": 10**7, "items": {"type": "string", "minLength": 5, "maxLength": 10**8,
                                                                   "pattern": "^[a-z]{1,1000000}$"}}},
    "huge integer bound": {"type": "integer", "minimum": 10**4000},
    "references that double": _ref_bomb(30),
    "nested groups in a pattern": {"type": "string", "pattern": "(" * 300 + "a" + ")" * 300},
    "counts inside counts": {"type": "string", "pattern": "^((a{1,60}b{2,70}){3,9000}c){0,99999}$"},
    "patterns that count far": {"type": "string", "allOf": [{"pattern": "^[a-z]{1,3000}$"}, {"pattern": "^(ab|ba)*"}],
                                "maxLength": 5000},
    "too many subschemas": {"type": "object", "properties": {f"p{i}": {"type": "object", "properties": {"q": {}}}
                                                              for i in range(MAX_SCHEMA_NODES)}},
}
