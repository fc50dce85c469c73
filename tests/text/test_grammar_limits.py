"""Schemas the grammar once wrote out or refused: numeric ranges, long counts, large enums, several
patterns at once, and hostile schemas, whose grammar work is bounded by counts (schema nodes,
grammar rules and bytes), never by seconds.

Languages are checked with the tests' own GBNF reader (tests/support/gbnf.py), and every grammar
with llama.cpp's parser."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import gbnf
from support.hostile_schemas import HOSTILE

from openai_ext.text import grammar, tools
from openai_ext.text.grammar import limits
from openai_ext.text.grammar.errors import SchemaNotSupported
from openai_ext.text.protocol import ChatCompletionRequest

MSG = [{"role": "user", "content": "hi"}]


def language(schema, strict=True):
    return gbnf.parse(grammar.schema_to_gbnf(schema, where="s", strict=strict))


def rules_and_bytes(text: str) -> tuple[int, int]:
    return len(text.splitlines()), len(text.encode())


# --- integers: the range written digit by digit -------------------------------------------------

BOUND = st.one_of(st.none(), st.integers(-10**6, 10**6), st.integers(-10**18, 10**18))


@settings(max_examples=150, deadline=None)
@given(BOUND, BOUND, st.booleans(), st.booleans(), st.integers(0, 10**6))
def test_every_integer_in_range_is_in_the_language_and_none_outside(lo, hi, lo_ex, hi_ex, seed):
    schema = {"type": "integer"}
    if lo is not None:
        schema["exclusiveMinimum" if lo_ex else "minimum"] = lo
    if hi is not None:
        schema["exclusiveMaximum" if hi_ex else "maximum"] = hi
    first = None if lo is None else lo + lo_ex
    last = None if hi is None else hi - hi_ex
    if first is not None and last is not None and first > last:
        with pytest.raises(SchemaNotSupported):
            grammar.schema_to_gbnf(schema, where="s")
        return
    g = language(schema)
    valid = jsonschema.Draft202012Validator(schema)
    near = {0, 1, -1, 9, 10, -10, 99, 100, 10**15, -10**15}
    for b in (first, last):
        if b is not None:
            near |= {b + d for d in range(-12, 13)} | {b * 10, b // 10, -b}
    if first is not None and last is not None and last - first <= 400:
        near |= set(range(first - 3, last + 4))      # a small range: every integer, and past both ends
    rng = __import__("random").Random(seed)
    near |= {rng.randint(-10**7, 10**7) for _ in range(20)}
    for value in near:
        if abs(value) >= 10**16:
            continue                                  # beyond the digits the grammar writes
        assert gbnf.matches(g, str(value)) == valid.is_valid(value), (schema, value)
    if lo is not None or hi is not None:     # one text per integer: no "-0", no leading zeros
        assert not gbnf.matches(g, "-0") and not gbnf.matches(g, "007")


@pytest.mark.parametrize("schema, inside, outside", [
    ({"minimum": 2.5, "maximum": 7.2}, [3, 7], [2, 8]),            # fractional bounds of an integer
    ({"exclusiveMinimum": -1.5, "exclusiveMaximum": 1e300}, [-1, 0, 10**15], [-2]),
    ({"minimum": 10**20}, [10**20, 10**20 + 7], [10**20 - 1, 5]),   # past 16 digits: as many as the bound has
    ({"maximum": -10**20}, [-10**20, -(10**20 + 1)], [-10**20 + 1, 0]),
])
def test_integer_bounds_of_every_kind(schema, inside, outside):
    g = language({"type": "integer", **schema})
    assert all(gbnf.matches(g, str(v)) for v in inside)
    assert not any(gbnf.matches(g, str(v)) for v in outside)


# --- numbers: as far as a grammar can, and never a text outside the range -----------------------

NUM = st.one_of(st.none(), st.integers(-1000, 1000), st.floats(-1000, 1000, allow_nan=False).map(lambda f: round(f, 3)))


def texts_near(values, rng):
    out = {"0", "1", "-1", "0.5", "-0.5", "1.0000000000000001", "0.30000000000000004"}
    for v in values:
        for delta in (0, 1, -1, 0.001, -0.001, 1e-9, -1e-9):
            out.add(repr(v + delta))
            out.add(f"{v + delta:.6f}")
        out.add(str(v) + "0")
    out |= {f"{rng.uniform(-1100, 1100):.{rng.randint(0, 8)}f}" for _ in range(30)}
    return {t for t in out if "e" not in t and "inf" not in t and "nan" not in t}


@pytest.mark.slow   # 120 examples, each a grammar built and searched: seconds
@settings(max_examples=120, deadline=None)
@given(NUM, NUM, st.sampled_from(["inclusive", "exclusive", "mixed"]), st.integers(0, 10**6))
def test_number_texts_in_the_language_are_in_range_and_short_ones_all_are(lo, hi, kind, seed):
    schema = {"type": "number"}
    if lo is not None:
        schema["exclusiveMinimum" if kind == "exclusive" else "minimum"] = lo
    if hi is not None:
        schema["exclusiveMaximum" if kind != "inclusive" else "maximum"] = hi
    valid = jsonschema.Draft202012Validator(schema)
    try:
        g = language(schema)
    except SchemaNotSupported as e:
        assert e.param.startswith("s"), e.message
        assert not any(valid.is_valid(x / 8) for x in range(-9000, 9000))   # nothing was in range
        return
    rng = __import__("random").Random(seed)
    for text in texts_near([b for b in (lo, hi) if b is not None], rng):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        if gbnf.matches(g, text):
            assert valid.is_valid(value), (schema, text)      # never a text outside the range
        elif (valid.is_valid(value) and re.fullmatch(r"-?(0|[1-9]\d{0,15})(\.\d{1,6})?", text)
              and not re.fullmatch(r"-0(\.0*)?", text)):     # zero is written without a sign
            # a plain text of at most 6 decimals, in range: the grammar writes it (an exclusive
            # bound is the next float, so only texts within a rounding step of it are missing)
            bounds = [b for b in (lo, hi) if b is not None]
            assert kind != "inclusive" and any(abs(value - b) < 1e-9 for b in bounds), (schema, text)


def test_a_number_that_reads_as_its_exclusive_bound_is_outside():
    """1.0000000000000001 reads as the float 1.0, which exclusiveMinimum 1 excludes."""
    g = language({"type": "number", "exclusiveMinimum": 1, "maximum": 2})
    assert not gbnf.matches(g, "1.0000000000000001") and not gbnf.matches(g, "1")
    assert gbnf.matches(g, "1.0000000000000003") and gbnf.matches(g, "1.5") and gbnf.matches(g, "2.0")
    assert not gbnf.matches(g, "2.0000000000000001") or json.loads("2.0000000000000001") <= 2


def test_ranges_parse_in_llama_cpp(llama_host):
    for schema in ({"type": "integer", "minimum": -37, "maximum": 123456789012},
                   {"type": "number", "exclusiveMinimum": 0, "maximum": 0.75},
                   {"type": "number", "minimum": -1e-20, "exclusiveMaximum": 3.25e10},
                   {"type": "integer", "minimum": 10**40}):
        assert llama_host.check_grammar(grammar.schema_to_gbnf(schema, where="s")), schema


# --- long counts: exact, and a few rules however long --------------------------------------------

@pytest.mark.parametrize("lo, hi", [(0, 100), (3, 200), (70, 70), (65, 130), (1000, None), (0, 5000), (3000, 5000)])
def test_long_string_bounds_are_exact_and_small(lo, hi):
    schema = {"type": "string", "minLength": lo, **({"maxLength": hi} if hi is not None else {})}
    text = grammar.schema_to_gbnf(schema, where="s")
    rules, size = rules_and_bytes(text)
    assert rules <= 60 and size <= 4000, (rules, size)
    g = gbnf.parse(text)
    top = hi if hi is not None else lo + 10
    for n in {max(lo - 1, 0), lo, lo + 1, top - 1, top, top + 1}:
        ok = lo <= n and (hi is None or n <= hi)
        assert gbnf.matches(g, json.dumps("a" * n)) == ok, n
    assert gbnf.matches(g, json.dumps("é\\\"" * (lo // 3 + 1) if hi is None or lo // 3 * 3 + 3 <= hi else "é" * lo))


@pytest.mark.parametrize("lo, hi, prefix", [(0, 150, 0), (100, 230, 0), (2, 90, 2), (80, None, 1)])
def test_long_array_bounds_are_exact(lo, hi, prefix):
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": lo,
              **({"prefixItems": [{"type": "boolean"}] * prefix} if prefix else {}),
              **({"maxItems": hi} if hi is not None else {})}
    g = language(schema)
    top = hi if hi is not None else lo + 5
    for n in {max(lo - 1, prefix), lo, top, top + 1}:
        value = [True] * prefix + list(range(n - prefix))
        assert gbnf.matches(g, json.dumps(value)) == (lo <= n and (hi is None or n <= hi)), n


def test_a_524288_character_bound_is_a_few_dozen_rules(llama_host):
    """Claude Code's Workflow tool: once 5 MB of nested groups that llama.cpp recursed into."""
    schema = {"type": "object", "properties": {"script": {"type": "string", "maxLength": 524288}}, "required": ["script"]}
    text = grammar.schema_to_gbnf(schema, where="s", strict=False)
    rules, size = rules_and_bytes(text)
    assert rules <= 50 and size <= 2500, (rules, size)
    assert llama_host.check_grammar(text)
    g = gbnf.parse(text)
    assert gbnf.matches(g, '{"script": "ls -la"}') and gbnf.matches(g, '{"script": ""}')


# --- enums: a tree of their texts ---------------------------------------------------------------

def test_a_large_enum_is_a_tree_that_holds_exactly_its_values(llama_host):
    values = [f"v{i}" for i in range(400)] + ["", "a", "ab", "abc", 1, 12, 1.5, None, True, {"k": [1]}, "é\"\n"]
    text = grammar.schema_to_gbnf({"enum": values}, where="s")
    assert llama_host.check_grammar(text)
    g = gbnf.parse(text)
    for v in values:
        assert gbnf.matches(g, json.dumps(v, ensure_ascii=False)), v
    for miss in ['"v400"', '"v"', '"abcd"', "123", '"A"', "false", '"v1 "']:
        assert not gbnf.matches(g, miss), miss
    # each rule's alternatives begin with different characters: one is followed at a time
    for line in text.splitlines():
        body = line.split(" ::= ", 1)[1]
        if line.startswith("root-t") or line.startswith("root ::="):
            firsts = [alt.strip()[:3] for alt in body.split(" | ") if alt.strip().startswith('"')]
            assert len(firsts) == len(set(firsts)), line


# --- several patterns at once (what zod writes), with lengths ------------------------------------

ZOD = ["^[a-z]", "[a-z0-9]$", "^[a-z0-9_-]+$", "-", "^.{2,6}$", "^[^A-Z]*$", "ab", "^(a|b)+", "^[a-z]+(-[a-z]+)*$"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(ZOD), min_size=2, max_size=3, unique=True), st.integers(0, 3),
       st.one_of(st.none(), st.integers(3, 9)), st.lists(st.text("ab-_1A ", max_size=10), min_size=25, max_size=25))
def test_all_of_patterns_and_lengths_hold_exactly(patterns, lo, hi, samples):
    assume(hi is None or lo <= hi)
    schema = {"type": "string", "allOf": [{"pattern": p} for p in patterns], "minLength": lo,
              **({"maxLength": hi} if hi is not None else {})}
    valid = jsonschema.Draft202012Validator(schema)
    try:
        g = language(schema)
    except SchemaNotSupported as e:
        assert e.param == "s.pattern" and "no string" in e.message
        assert not any(valid.is_valid(s) for s in samples)
        return
    for s in samples + ["ab", "a-b", "abc_1", "a", "ab-cd"]:
        assert gbnf.matches(g, json.dumps(s)) == valid.is_valid(s), (patterns, lo, hi, s)


def test_zods_send_message_recipient():
    """Claude Code's SendMessage: a regex and a length check, as zod writes them (allOf)."""
    to = {"type": "string", "allOf": [{"pattern": "^[a-zA-Z0-9_-]+(@[a-zA-Z0-9_-]+)?$"}, {"pattern": "^.{1,64}$"}]}
    g = language({"type": "object", "properties": {"to": to}, "required": ["to"]})
    assert gbnf.matches(g, '{"to": "team-lead@backend"}') and gbnf.matches(g, '{"to": "' + "a" * 64 + '"}')
    assert not gbnf.matches(g, '{"to": "' + "a" * 65 + '"}') and not gbnf.matches(g, '{"to": "a b"}')
    assert not gbnf.matches(g, '{"to": ""}')


def test_constants_are_matched_to_patterns_without_a_backtracking_engine(monkeypatch):
    """A constant or enum value is checked against its pattern while the schema is prepared; with
    ^(a+)+$ and 'aaa...a!' a backtracking engine would hold the process (and the GIL) for hours."""
    import jsonschema._keywords

    def backtracking(*args, **kwargs):
        raise AssertionError("re.search was used")

    monkeypatch.setattr(jsonschema._keywords.re, "search", backtracking)
    hostile = {"type": "string", "pattern": "^(a+)+$", "enum": ["a" * 5000 + "!", "aaa", 'x"y']}
    assert grammar.prepare(hostile, "s").schema == {"enum": ["aaa"]}
    with pytest.raises(SchemaNotSupported) as e:
        grammar.prepare({"const": "a" * 5000 + "!", "pattern": "^(a+)+$"}, "s")
    assert e.value.param == "s.const"
    assert grammar.prepare({"const": 'quote " and \\\\', "pattern": "\\\\"}, "s").schema == {"const": 'quote " and \\\\'}
    # a pattern that cannot be matched that way: strict, a 400; otherwise kept for after generation
    lookahead = {"enum": ["ab", "b"], "pattern": "^(?=a)"}
    with pytest.raises(SchemaNotSupported) as e:
        grammar.prepare(lookahead, "s")
    assert e.value.param == "s.pattern"
    relaxed = grammar.prepare(lookahead, "s", strict=False)
    assert relaxed.schema == {"enum": ["ab", "b"]} and relaxed.relaxed


def test_a_pattern_next_to_a_length_it_implies_is_the_pattern_alone():
    assert grammar.prepare({"type": "string", "pattern": "^[a-z]{1,20}$", "maxLength": 64}, "s").schema.keys() == \
        {"type", "x-pattern"}


# --- the limits: bounded work for any schema ------------------------------------------------------

class CountingBudget(limits.Budget):
    """The request's allowance, with what was drawn counted."""

    def __init__(self):
        super().__init__()
        self.drawn_steps = self.drawn_rules = 0

    def step(self, n=1, path=None):
        super().step(n, path)
        self.drawn_steps += n            # drawn, not only asked for

    def grammar(self, body):
        super().grammar(body)
        self.drawn_rules += 1


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("strict", [True, False])
def test_a_hostile_schema_costs_bounded_work(llama_host, name, strict):
    """Refused (a 400 naming where) or written, within counted limits; never a grammar llama.cpp
    cannot take. Without strict, only a schema too large to check is refused."""
    g = grammar.Grammar(CountingBudget())
    try:
        prepared = grammar.write_schema(g, "root", HOSTILE[name], "s", strict=strict)
    except SchemaNotSupported as e:
        assert e.param.startswith("s"), e.param
        assert strict or name == "too many subschemas", e.message
        return
    text = g.text()
    rules, size = rules_and_bytes(text)
    assert size <= limits.MAX_GRAMMAR_BYTES and rules <= limits.MAX_GRAMMAR_RULES
    assert g.budget.drawn_steps <= limits.MAX_STEPS and g.budget.drawn_rules <= limits.MAX_GRAMMAR_RULES * 2
    assert strict or prepared.relaxed or name in ("huge maxLength", "huge minLength and maxItems",
                                                  "deep optional nesting", "counts inside counts")
    assert llama_host.check_grammar(text)


def test_strict_refusals_name_the_part():
    cases = {"many alternatives": "s.anyOf", "huge integer bound": "s.minimum", "long enum texts": "s.enum",
             "nested groups in a pattern": "s.pattern", "patterns that count far": "s.pattern"}
    for name, param in cases.items():
        with pytest.raises(SchemaNotSupported) as e:
            grammar.schema_to_gbnf(HOSTILE[name], where="s", strict=True)
        assert e.value.param == param, (name, e.value.param)


def test_non_strict_tools_are_relaxed_never_refused():
    """tool_choice auto with Claude Code's kind of tools: the whole request goes through, and a
    tool whose grammar was relaxed is marked so its calls are validated before they are sent."""
    def fn(name, params):
        return {"type": "function", "function": {"name": name, "parameters": params}}
    ts = tools.parse(ChatCompletionRequest(messages=MSG, tools=[
        fn("ordinary", {"type": "object", "properties": {"q": {"type": "string"}}}),
        fn("hostile_enum", {"type": "object", "properties": {"e": HOSTILE["huge enum"]}}),
        fn("lookahead", {"type": "object", "properties": {"w": {"type": "string", "pattern": "^(?!x)\\w+$"}}}),
        fn("conflict", {"type": "object", "properties": {"f": {"allOf": [{"format": "date"}, {"format": "uuid"}]}}}),
    ]))
    text = tools.call_grammar(ts, lazy=True)
    assert [t.exact for t in ts.tools] == [True, False, False, False]
    assert len(text.encode()) < 20_000


def test_the_budget_is_shared_and_strict_schemas_draw_first(monkeypatch):
    from openai_ext.text.grammar import converter
    monkeypatch.setattr(converter, "Budget", lambda: limits.Budget(grammar_bytes=60_000))
    big = {"type": "object", "properties": {"e": {"enum": [f"long-value-{i:05}" * 2 for i in range(1500)]}}}
    ts = tools.parse(ChatCompletionRequest(messages=MSG, tool_choice="required", tools=[
        {"type": "function", "function": {"name": "loose_one", "parameters": big}},
        {"type": "function", "function": {"name": "strict_one", "strict": True, "parameters": big}}]))
    tools.call_grammar(ts)
    assert [t.exact for t in ts.tools] == [False, True]     # the strict one kept its grammar
