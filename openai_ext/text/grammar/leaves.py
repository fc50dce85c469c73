"""The shapes ``rewrite`` brings each kind of value into: constants and enums, strings (patterns,
lengths, formats), numbers (ranges), arrays and objects.

A prepared leaf holds only what the converter writes: ``x-pattern`` (a parsed pattern or the
automaton of several, see ``automata``), ``x-range`` (the GBNF of a numeric range, see
``numbers``), ``x-array`` (prefix items, the item, and counts).
"""

from __future__ import annotations

import json
import math
import threading
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator, ValidationError, validators

from .automata import TooComplex, combine, search
from .errors import SchemaNotSupported
from .limits import MAX_AUTOMATON_STATES, MAX_LITERAL_BYTES, Budget
from .numbers import BoundTooLarge, integer_bounds, integer_range, number_bounds, number_range
from .patterns import parse as parse_pattern

STRING_KW = {"minLength", "maxLength", "pattern", "format"}
ARRAY_KW = {"items", "prefixItems", "minItems", "maxItems"}
OBJECT_KW = {"properties", "required", "additionalProperties"}
NUMBER_KW = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
# Formats with a grammar of their own; other formats are annotations in JSON Schema 2020-12.
FORMATS = {"date", "time", "date-time", "uuid"}
# Patterns beyond a schema's own "pattern", from merged parts (allOf, $ref siblings). A key no
# JSON object can hold, so a schema cannot set it.
MORE_PATTERNS = ("pattern",)


_PY_TYPES: dict[str, tuple[Any, ...]] = {"null": (type(None),), "boolean": (bool,), "string": (str,),
                                         "array": (list,), "object": (dict,), "number": (int, float),
                                         "integer": (int, float)}


def _of_type(value: Any, kinds: Any) -> bool:
    """Whether a JSON value has one of the types ``kinds`` (None: any), as JSON Schema says."""
    if kinds is None:
        return True
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        if isinstance(value, _PY_TYPES.get(kind, ())) and (kind not in ("number", "integer")
                                                            or not isinstance(value, bool)):
            if kind != "integer" or isinstance(value, int) or float(value).is_integer():
                return True
    return False


class Unsatisfiable(SchemaNotSupported):
    """No value satisfies this part. Inside anyOf/oneOf, that branch is dropped instead."""


_unchecked = threading.local()   # a pattern the last check could not run (see _pattern)


def _pattern(validator, pattern, instance, schema):
    """The pattern keyword, matched in linear time (automata.search), never by a backtracking
    engine: a constant and a hostile pattern would otherwise hold the process for hours."""
    if not validator.is_type(instance, "string"):
        return
    found = search(pattern, instance)
    if found is None:
        _unchecked.pattern = pattern
    elif not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# The validator that checks constants and enum values against the rest of their schema.
Checker = validators.extend(Draft202012Validator, {"pattern": _pattern})


class Leaves:
    """The typed leaves of ``rewrite._Rewriter`` (which provides node, cannot and budget)."""

    validator: Draft202012Validator   # a Checker
    if TYPE_CHECKING:   # what _Rewriter provides
        budget: Budget

        def cannot(self, path: str, message: str) -> None: ...

        def node(self, n: Any, path: str, depth: int = 0) -> Any: ...

    def _valid(self, value: Any, n: dict[Any, Any], path: str) -> bool:
        """Whether ``value`` satisfies ``n``. A pattern that cannot be matched safely here is
        what the grammar cannot enforce (see cannot); without strict the value is kept."""
        schema = {k: v for k, v in n.items() if isinstance(k, str)}
        if MORE_PATTERNS in n:
            schema["allOf"] = [*schema.get("allOf", []), *({"pattern": p} for p in n[MORE_PATTERNS])]
        _unchecked.pattern = None
        ok = self.validator.evolve(schema=schema).is_valid(value)
        if _unchecked.pattern is not None:
            self.cannot(f"{path}.pattern", f"{path}.pattern: {_unchecked.pattern!r} cannot be checked against the "
                                           "enum or const while generating.")
        return ok

    def _literals_fit(self, values: list[Any], path: str) -> bool:
        """Whether the JSON text of ``values`` is small enough to write (else: see cannot)."""
        if len(values) > self.budget.steps:
            self.cannot(path, f"{path}: {len(values)} values are more than this server checks and writes into a "
                              "grammar for one request.")
            return False
        self.budget.step(len(values), path)
        size = 0
        for v in values:
            size += len(json.dumps(v, ensure_ascii=False))
            if size > MAX_LITERAL_BYTES:
                self.cannot(path, f"{path}: its values take more than {MAX_LITERAL_BYTES} bytes of JSON, more than "
                                  "this server writes into a grammar.")
                return False
        return True

    def _leaf(self, n: dict[str, Any], path: str) -> Any:
        if "const" in n and self._literals_fit([n["const"]], f"{path}.const"):
            if not self._valid(n["const"], n, path):
                raise Unsatisfiable(f"{path}.const: the constant does not satisfy the rest of the schema.",
                                    param=f"{path}.const")
            return {"const": n["const"]}
        if "enum" in n and self._literals_fit(n["enum"], f"{path}.enum"):
            # The converter writes enum values as they are: keep those the rest of the schema allows.
            if n.keys() <= {"enum", "type"}:
                values = [v for v in n["enum"] if _of_type(v, n.get("type"))]
            else:
                values = [v for v in n["enum"] if self._valid(v, n, path)]
            if not values:
                raise Unsatisfiable(f"{path}.enum: no value of the enum satisfies the rest of the schema.",
                                    param=f"{path}.enum")
            return {"enum": values}
        if "type" in n:
            types = list(dict.fromkeys(n["type"] if isinstance(n["type"], list) else [n["type"]]))
            if "number" in types and "integer" in types:
                types.remove("integer")
        else:  # no type: the keywords say which kinds of value they constrain
            types = [t for t, kws in (("string", STRING_KW), ("array", ARRAY_KW), ("object", OBJECT_KW),
                                      ("number", NUMBER_KW)) if kws & n.keys()]
            if "pattern" not in n and MORE_PATTERNS in n:
                types.insert(0, "string")
        if not types:
            return {}
        variants = [self._typed(n, t, path) for t in types]
        return variants[0] if len(variants) == 1 else {"anyOf": variants}

    def _typed(self, n: dict[str, Any], kind: str, path: str) -> dict[str, Any]:
        """The part of ``n`` that applies to values of type ``kind`` (other keywords do not)."""
        if kind == "string":
            return self._string(n, path)
        if kind == "array":
            return self._array(n, path)
        if kind == "object":
            return self._object(n, path)
        if kind in ("integer", "number"):
            return self._number(n, kind, path)
        return {"type": kind}

    def _number(self, n: dict[str, Any], kind: str, path: str) -> dict[str, Any]:
        bounds = {k: n[k] for k in NUMBER_KW if k in n}
        if not bounds:
            return {"type": kind}
        here = f"{path}.{next(iter(bounds))}"
        if not all(isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)) for v in bounds.values()):
            self.cannot(here, f"{here}: a bound that is not a finite number cannot be enforced while generating.")
            return {"type": kind}
        try:
            if kind == "integer":
                expr = integer_range(*integer_bounds(bounds))
            else:
                decimals = number_bounds(bounds)
                expr = None if decimals is None else number_range(*decimals)
        except BoundTooLarge as e:
            self.cannot(here, f"{here}: {e} cannot be written into a grammar.")
            return {"type": kind}
        if expr is None:
            raise Unsatisfiable(f"{path}: no {kind} is within its minimum and maximum.", param=here)
        return {"type": kind, "x-range": expr}

    def _string(self, n: dict[Any, Any], path: str) -> dict[str, Any]:
        lo, hi, fmt = n.get("minLength", 0), n.get("maxLength"), n.get("format")
        if hi is not None and lo > hi:
            raise Unsatisfiable(f"{path}: minLength is above maxLength.", param=f"{path}.minLength")
        sources = ([n["pattern"]] if "pattern" in n else []) + list(n.get(MORE_PATTERNS, []))
        if fmt in FORMATS:
            if sources or lo or hi is not None:
                self.cannot(f"{path}.format", f"{path}.format: format {fmt!r} fixes the text, so it cannot be "
                                              "combined with a pattern, minLength or maxLength while generating.")
            return {"type": "string", "format": fmt}
        patterns = []
        for source in sources:
            try:
                patterns.append(parse_pattern(source, f"{path}.pattern"))
            except SchemaNotSupported as e:
                self.cannot(f"{path}.pattern", e.message)
        # a single pattern is written as its full matches: lengths they all have need no enforcing
        if len(patterns) == 1 and lo <= patterns[0].lengths[0] and (hi is None or patterns[0].lengths[1] <= hi):
            lo, hi = 0, None
        if not patterns:
            out: dict[str, Any] = {"type": "string"}
            if lo:
                out["minLength"] = lo
            if hi is not None:
                out["maxLength"] = hi
            return out
        if len(patterns) == 1 and not lo and hi is None:
            return {"type": "string", "x-pattern": patterns[0]}
        try:
            combined = combine(patterns, lo, hi)
        except TooComplex:
            self.cannot(f"{path}.pattern", f"{path}.pattern: its patterns, minLength and maxLength together need "
                                           f"more than {MAX_AUTOMATON_STATES} states to be enforced while "
                                           "generating; put the length into one pattern, or make it smaller.")
            return {"type": "string", "x-pattern": patterns[0]}
        if combined.empty:
            self.cannot(f"{path}.pattern", f"{path}.pattern: no string the grammar can write (characters a JSON "
                                           "string holds unescaped, and the pattern's literal ones) satisfies its "
                                           "patterns, minLength and maxLength together.")
            return {"type": "string", "x-pattern": patterns[0]}
        return {"type": "string", "x-pattern": combined}

    def _array(self, n: dict[str, Any], path: str) -> dict[str, Any]:
        items, prefix = n.get("items"), n.get("prefixItems") or []
        lo, hi = n.get("minItems", 0), n.get("maxItems")
        if isinstance(items, list):
            raise SchemaNotSupported(f"{path}.items: items must be one schema; for a tuple, use prefixItems.",
                                     param=f"{path}.items")
        if items is None and not prefix and lo == 0 and hi is None:
            return {"type": "array"}
        head = []
        for i, sub in enumerate(prefix):
            if sub is False:  # nothing may stand at position i: the array is shorter
                hi = i if hi is None else min(hi, i)
                break
            head.append(self.node(sub, f"{path}.prefixItems[{i}]"))
        if hi is not None:
            head = head[:hi]
        more_lo = max(0, lo - len(head))
        more_hi = None if hi is None else hi - len(head)
        if items is False or (items is None and prefix):
            more_hi = more_lo if items is None else 0  # without items, extras are allowed, not needed
        if more_hi is not None and more_lo > more_hi:
            raise Unsatisfiable(f"{path}: no array satisfies minItems, maxItems and items together.",
                                 param=f"{path}.minItems")
        item = self.node(items, f"{path}.items") if isinstance(items, dict) else {}
        return {"type": "array", "x-array": {"prefix": head, "item": item, "min": more_lo, "max": more_hi}}

    def _object(self, n: dict[str, Any], path: str) -> dict[str, Any]:
        props, required = n.get("properties") or {}, list(dict.fromkeys(n.get("required") or []))
        extra = n.get("additionalProperties")
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if sub is False:
                if name in required:
                    raise Unsatisfiable(f"{path}.properties.{name}: the property is required but its schema is "
                                         "false.", param=f"{path}.properties.{name}")
                continue  # never written
            out[name] = self.node(sub, f"{path}.properties.{name}")
        for name in required:
            if name not in props:
                if extra is False:
                    raise Unsatisfiable(f"{path}.required: {name!r} is required, but it is not among the properties "
                                         "and additionalProperties is false.", param=f"{path}.required")
                # the converter would leave a required name without a property out of the output
                out[name] = self.node(extra, f"{path}.additionalProperties") if isinstance(extra, dict) else {}
        if not out:
            if isinstance(extra, dict):
                return {"type": "object", "additionalProperties": self.node(extra, f"{path}.additionalProperties")}
            if extra is False:
                return {"type": "object", "properties": {}, "additionalProperties": False}
            return {"type": "object"}
        # Extra properties are allowed, never needed: leaving them out keeps every output valid,
        # and keeps the converter from writing an extra key that repeats a declared one.
        return {"type": "object", "properties": out, "required": [r for r in required if r in out]}
