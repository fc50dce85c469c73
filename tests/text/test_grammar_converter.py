"""The project's own JSON Schema -> GBNF converter: it needs no llama-cpp-python, every grammar it
writes is read by llama.cpp's own parser, every value valid under a schema is in its grammar's
language, and every text of the language is valid JSON under the schema.

The language is checked with a small GBNF reader of the tests (tests/support/gbnf.py), written
apart from the converter."""

from __future__ import annotations

import json
import random
import string
import subprocess
import sys

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ROOT, gbnf

from openai_ext.text.grammar import schema_to_gbnf

NAMES = st.sampled_from(["a", "b", "name", "x y", "ünï", "id", "value"])
LEAVES = st.one_of(
    st.just({"type": "string"}),
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
    st.tuples(st.integers(0, 3), st.integers(0, 3)).map(
        lambda t: {"type": "string", "minLength": t[0], "maxLength": t[0] + t[1]}),
    st.sampled_from([{"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
                     {"type": "string", "format": "date"}, {"type": "string", "format": "uuid"},
                     {"type": "string", "format": "time"}, {"type": "string", "pattern": "^[a-c]{2,4}$"},
                     {"type": ["string", "null"]}, {"enum": ["red", "green", 3, None]},
                     {"const": {"k": [1, "two"]}}, {}]),
)


def _composites(inner):
    return st.one_of(
        st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(
            lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]}),
        st.tuples(st.lists(inner, min_size=1, max_size=3), st.booleans()).map(
            lambda t: {"type": "array", "prefixItems": t[0], "items": False if t[1] else {"type": "integer"},
                       "maxItems": len(t[0]) + 2}),
        st.dictionaries(NAMES, inner, min_size=1, max_size=4).flatmap(
            lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
                lambda req: {"type": "object", "properties": props, "required": req,
                             "additionalProperties": False})),
        st.lists(inner, min_size=2, max_size=3).map(lambda bs: {"anyOf": bs}),
        inner.map(lambda s: {"type": "object", "additionalProperties": s}),
    )


SCHEMAS = st.recursive(LEAVES, _composites, max_leaves=8)


def value_for(schema: dict, rng: random.Random, depth: int = 0):
    """A value valid under ``schema`` (one of the shapes above), with object keys in the schema's
    order, as the grammar writes them."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "anyOf" in schema:
        return value_for(rng.choice(schema["anyOf"]), rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind is None:
        return rng.choice([1, "x", None, True, [1, 2], {"a": "b"}, 2.5])
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "integer":
        return rng.randint(-10**6, 10**6)
    if kind == "number":
        return rng.randint(-10**6, 10**6) / 1000
    if kind == "string":
        fmt = schema.get("format")
        if fmt == "date":
            return f"20{rng.randint(10, 39)}-{rng.randint(1, 12):02}-{rng.randint(1, 28):02}"
        if fmt == "uuid":
            return "12345678-9abc-def0-1234-56789abcdef0"
        if fmt == "time":
            return f"{rng.randint(0, 23):02}:{rng.randint(0, 59):02}:{rng.randint(0, 59):02}Z"
        if "pattern" in schema:
            return "".join(rng.choice("abc") for _ in range(rng.randint(2, 4)))
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 5)
        alphabet = string.ascii_letters + ' "\\\n\té€'
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))
    if kind == "array":
        if "prefixItems" in schema:
            head = [value_for(s, rng, depth + 1) for s in schema["prefixItems"]]
            extra = 0 if schema["items"] is False else rng.randint(0, 2)
            return head + [value_for(schema["items"], rng, depth + 1) for _ in range(extra)]
        n = rng.randint(schema.get("minItems", 0), schema.get("maxItems", 2))
        return [value_for(schema["items"], rng, depth + 1) for _ in range(n)]
    if kind == "object":
        if "properties" not in schema:
            return {f"k{i}": value_for(schema["additionalProperties"], rng, depth + 1) for i in range(rng.randint(0, 2))}
        req = set(schema["required"])
        return {k: value_for(s, rng, depth + 1) for k, s in schema["properties"].items()
                if k in req or rng.random() < 0.5}
    raise AssertionError(schema)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCHEMAS, st.integers(0, 10**6))
def test_valid_values_are_in_the_language_and_the_language_is_valid(schema, seed):
    text = schema_to_gbnf(schema, where="response_format", strict=True)
    g = gbnf.parse(text)
    rng = random.Random(seed)
    for _ in range(4):
        value = value_for(schema, rng)
        jsonschema.validate(value, schema)                    # the generator's own check
        dumped = json.dumps(value, ensure_ascii=False)   # constants are written as json.dumps writes them
        assert gbnf.matches(g, dumped), (schema, dumped, text)
    for _ in range(4):
        sampled = gbnf.sample(g, rng)
        jsonschema.validate(json.loads(sampled), schema)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(SCHEMAS, st.just({"type": "object"}), st.just({})))
def test_llama_cpps_parser_reads_every_grammar(llama_host, schema):
    text = schema_to_gbnf(schema, where="response_format")
    assert llama_host.check_grammar(text), text


def test_no_unbounded_blanks_and_no_bare_control_characters():
    g = gbnf.parse(schema_to_gbnf({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]},
                                  where="x"))
    assert gbnf.matches(g, '{"s": "a"}') and gbnf.matches(g, '{"s":"a"}')
    assert not gbnf.matches(g, '{  "s": "a"}')                 # one blank at most
    assert not gbnf.matches(g, '{"s": "a\nb"}')                # a raw newline is not JSON
    assert gbnf.matches(g, '{"s": "a\\nb\\u00e9"}')
    assert not gbnf.matches(g, '{"s": "\\ud83d\\ude00"}')      # a surrogate pair counts as one character
    assert "{" not in "".join(line.split("::=", 1)[1] for line in schema_to_gbnf(
        {"type": "string", "minLength": 2, "maxLength": 40}, where="x").splitlines()).replace('"{"', "")


def test_the_converter_needs_no_llama_cpp_python():
    """The web UI ships without llama-cpp-python: structured output must not need it."""
    code = ("import sys; sys.modules['llama_cpp'] = None\n"
            "from openai_ext.text.grammar import schema_to_gbnf\n"
            "print(schema_to_gbnf({'type': 'object', 'properties': {'n': {'type': 'integer'}}, 'required': ['n']},"
            " where='x'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    g = gbnf.parse(out.stdout)
    assert gbnf.matches(g, '{"n": 42}') and not gbnf.matches(g, '{"n": "42"}')
