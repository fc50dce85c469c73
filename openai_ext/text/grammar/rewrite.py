"""JSON Schema rewritten into the plain shapes the grammar converter handles exactly.

The converter silently ignores what it does not implement: keywords such as ``minimum``, but also
keywords it knows in combinations it does not handle (``enum`` under a list of types, ``required``
names missing from ``properties``, ``minItems`` without ``items``, siblings of ``anyOf`` or
``$ref`` ...). A grammar that ignored part of a schema could produce output that fails it. So every
schema is first rewritten (``prepare``): ``allOf`` and the siblings of ``anyOf``/``oneOf``/``$ref``
are merged in, type lists become ``anyOf`` with the keywords of each type, enum values are kept
only when they satisfy the rest of the schema, and references are renamed so several schemas can
share one grammar. What cannot be rewritten gets a 400 naming where it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from .errors import SchemaNotSupported, check_depth
from .patterns import pattern_gbnf

_STRING_KW = {"minLength", "maxLength", "pattern", "format"}
_ARRAY_KW = {"items", "prefixItems", "minItems", "maxItems"}
_OBJECT_KW = {"properties", "required", "additionalProperties"}
# Keywords the grammar enforces.
_ENFORCED = _STRING_KW | _ARRAY_KW | _OBJECT_KW | {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"}
# Keywords that describe and do not constrain, or that only hold definitions.
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated",
                "readOnly", "writeOnly", "$defs", "definitions", "strict", "contentMediaType",
                "contentEncoding", "$anchor", "$vocabulary",   # and OpenAPI's (nullable: see node())
                "example", "discriminator", "nullable", "externalDocs", "xml"}
_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
# Formats with a grammar of their own; other formats are annotations in JSON Schema 2020-12.
_FORMATS = {"date", "time", "date-time", "uuid"}
_MAX_INLINE = 32          # references merged into their siblings, one inside the other
_MAX_REPEAT = 1000        # llama.cpp writes out every repetition of a {m,n} as a rule

class _Unsatisfiable(SchemaNotSupported):
    """No value satisfies this part. Inside anyOf/oneOf, that branch is dropped instead."""


@dataclass
class Prepared:
    """A schema in the shapes the converter handles exactly; its references point into ``defs``."""
    schema: Any
    defs: dict[str, Any]


def prepare(schema: Any, where: str, *, prefix: str = "", strict: bool = True) -> Prepared:
    """Checks ``schema`` and rewrites it for the converter. ``prefix`` keeps the names of its
    definitions apart from those of other schemas. ``strict`` (a strict tool or json_schema): a
    keyword the grammar cannot enforce is a 400 naming it; otherwise it is left out of the grammar
    and the rest is enforced, as OpenAI accepts non-strict schemas."""
    check_depth(schema, where)
    if isinstance(schema, (dict, bool)):
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as e:
            here = _join(where, e.absolute_path)
            raise SchemaNotSupported(f"{here} is not a valid JSON Schema: {e.message}", param=here) from None
    rewriter = _Rewriter(schema, where, prefix, strict)
    try:
        return Prepared(rewriter.run(), rewriter.defs)
    except RecursionError:
        raise SchemaNotSupported(f"{where} nests too deeply to be turned into a grammar.", param=where) from None


def _join(where: str, parts) -> str:
    return where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 equals 1.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _type_meet(a: Any, b: Any) -> list[str]:
    left, right = set(a if isinstance(a, list) else [a]), set(b if isinstance(b, list) else [b])
    out = left & right
    if ("integer" in left and "number" in right) or ("number" in left and "integer" in right):
        out.add("integer")
    return sorted(out)


class _Rewriter:
    def __init__(self, root: Any, where: str, prefix: str, strict: bool = True):
        self.root, self.where, self.prefix, self.strict = root, where, prefix, strict
        self.validator = Draft202012Validator(root if isinstance(root, (dict, bool)) else {})
        self.defs: dict[str, Any] = {}
        self._names: dict[str, str] = {}            # JSON pointer -> name in defs
        self._todo: list[tuple[str, Any, str]] = []

    def run(self) -> Any:
        out = self.node(self.root, self.where)
        while self._todo:
            name, target, path = self._todo.pop()
            self.defs[name] = self.node(target, path)
        return out

    # a node and its combinators --------------------------------------------------------------
    def node(self, n: Any, path: str, depth: int = 0) -> Any:
        if depth > _MAX_INLINE:
            raise SchemaNotSupported(f"{path}: its references and allOf parts nest too deeply (or loop) to be "
                                     "merged.", param=path)
        if isinstance(n, dict) and n.get("nullable") is True:
            # OpenAPI's nullable: the value may also be null
            n = {"anyOf": [{k: v for k, v in n.items() if k != "nullable"}, {"type": "null"}]}
        n = self._plain(n, path)
        if "$ref" in n:
            rest = {k: v for k, v in n.items() if k != "$ref"}
            pointer, target_path, target = self._resolve(n["$ref"], path)
            if not rest:  # kept as a reference, so recursive schemas stay finite
                return {"$ref": self._def(pointer, target, target_path)}
            merged = self._merge(self._inline(target, target_path, depth + 1), rest, path)
            return self.node(merged, path, depth + 1)
        if "allOf" in n:
            merged = {k: v for k, v in n.items() if k != "allOf"}
            for i, part in enumerate(n["allOf"]):
                here = f"{path}.allOf[{i}]"
                merged = self._merge(merged, self._inline(part, here, depth + 1), here)
            return self.node(merged, path, depth + 1)
        if "anyOf" in n and "oneOf" in n:
            raise SchemaNotSupported(f"{path}: anyOf and oneOf side by side cannot be enforced; keep one of them.",
                                     param=f"{path}.oneOf")
        for key in ("anyOf", "oneOf"):
            if key in n:
                return self._union(n, key, path, depth)
        return self._leaf(n, path)

    def _plain(self, n: Any, path: str) -> dict[str, Any]:
        """``n`` as a dict of enforced keywords (a 400 for any other keyword)."""
        if n is True:
            return {}
        if n is False:
            raise _Unsatisfiable(f"{path} is the schema false, which no value satisfies.", param=path)
        if not isinstance(n, dict):
            raise SchemaNotSupported(f"{path} must be a JSON Schema object.", param=path)
        for key, value in n.items():
            here = f"{path}.{key}"
            if key in _ANNOTATIONS or key.startswith("x-"):
                continue
            if key not in _ENFORCED and not self.strict:
                continue   # a non-strict schema: enforced as far as the grammar can
            if key not in _ENFORCED:
                raise SchemaNotSupported(
                    f"{here}: the keyword '{key}' cannot be enforced while generating. Remove it from the schema "
                    f"(supported: {', '.join(sorted(_ENFORCED))}).", param=here)
            if key == "type":
                bad = [k for k in (value if isinstance(value, list) else [value]) if k not in _TYPES]
                if bad:
                    raise SchemaNotSupported(f"{here}: unknown type {bad[0]!r}.", param=here)
        return {k: v for k, v in n.items() if k in _ENFORCED}

    def _inline(self, n: Any, path: str, depth: int) -> dict[str, Any]:
        """``n`` with its own reference (if any) merged in, ready to be merged with siblings."""
        if depth > _MAX_INLINE:
            raise SchemaNotSupported(f"{path}: its references nest too deeply (or loop) to be merged.", param=path)
        n = self._plain(n, path)
        if "$ref" not in n:
            return n
        _, target_path, target = self._resolve(n["$ref"], path)
        rest = {k: v for k, v in n.items() if k != "$ref"}
        return self._merge(self._inline(target, target_path, depth + 1), rest, path)

    def _union(self, n: dict[str, Any], key: str, path: str, depth: int) -> Any:
        # Siblings of anyOf/oneOf hold for every branch: each branch gets them merged in.
        # (oneOf is enforced as anyOf: the grammar cannot rule out a value that fits two branches.)
        rest = {k: v for k, v in n.items() if k != key}
        branches, last_error = [], None
        for i, branch in enumerate(n[key]):
            here = f"{path}.{key}[{i}]"
            try:
                merged = self._merge(rest, self._inline(branch, here, depth + 1), here) if rest else branch
                branches.append(self.node(merged, here, depth + 1))
            except _Unsatisfiable as e:
                last_error = e
        if not branches:
            raise last_error or _Unsatisfiable(f"{path}.{key}: no branch can be satisfied.", param=f"{path}.{key}")
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def _merge(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        """A schema for values that satisfy both ``a`` and ``b`` (both without $ref)."""
        out = dict(a)
        objects = bool(_OBJECT_KW & a.keys() and _OBJECT_KW & b.keys())
        if objects:
            out = {k: v for k, v in out.items() if k not in _OBJECT_KW}
            out.update(self._merge_objects(a, b))
        for key, value in b.items():
            if objects and key in _OBJECT_KW:
                continue  # merged above
            if key not in out or _same(out[key], value):
                out[key] = value
            elif key == "type":
                out[key] = _type_meet(out[key], value)
                if not out[key]:
                    raise _Unsatisfiable(f"{path}.type: no type satisfies every part of the schema.",
                                         param=f"{path}.type")
            elif key == "enum":
                out[key] = [v for v in out[key] if any(_same(v, w) for w in value)]
                if not out[key]:
                    raise _Unsatisfiable(f"{path}.enum: no value is in every enum.", param=f"{path}.enum")
            elif key == "const":
                raise _Unsatisfiable(f"{path}.const: two different constants.", param=f"{path}.const")
            elif key in ("minLength", "minItems"):
                out[key] = max(out[key], value)
            elif key in ("maxLength", "maxItems"):
                out[key] = min(out[key], value)
            elif key == "items":
                out[key] = {"allOf": [out[key], value]}
            elif key == "allOf":
                out[key] = [*out[key], *value]
            else:
                raise SchemaNotSupported(f"{path}.{key}: parts of this schema give different '{key}' values, which "
                                         "cannot be combined while generating.", param=f"{path}.{key}")
        return out

    @staticmethod
    def _merge_objects(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        # A name outside one side's properties is governed by that side's additionalProperties.
        pa, pb = a.get("properties") or {}, b.get("properties") or {}
        xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
        props: dict[str, Any] = {}
        for name in {**pa, **pb}:
            sa, sb = pa.get(name, xa), pb.get(name, xb)
            if sa is False or sb is False:
                props[name] = False
            elif sa is True or sa == {} or _same(sa, sb):
                props[name] = sb
            elif sb is True or sb == {}:
                props[name] = sa
            else:
                props[name] = {"allOf": [sa, sb]}
        out: dict[str, Any] = {"properties": props,
                               "required": list(dict.fromkeys([*a.get("required", []), *b.get("required", [])]))}
        if xa is False or xb is False:
            out["additionalProperties"] = False
        elif xa is not True and xb is not True:
            out["additionalProperties"] = xa if _same(xa, xb) else {"allOf": [xa, xb]}
        elif xa is not True or xb is not True:
            out["additionalProperties"] = xb if xa is True else xa
        return out

    # references ------------------------------------------------------------------------------
    def _resolve(self, ref: Any, path: str) -> tuple[str, str, Any]:
        here = f"{path}.$ref"
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaNotSupported(f"{here}: only references inside the schema (#/$defs/Name) are supported; "
                                     f"{ref!r} points outside it. Put the definition under $defs.", param=here)
        pointer = unquote(ref[1:])
        if pointer and not pointer.startswith("/"):
            raise SchemaNotSupported(f"{here}: {ref!r} names an anchor; refer to definitions by their path "
                                     "(#/$defs/Name).", param=here)
        target, target_path = self.root, self.where
        for raw in pointer.split("/")[1:]:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target, target_path = target[part], f"{target_path}.{part}"
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target, target_path = target[int(part)], f"{target_path}[{part}]"
            else:
                raise SchemaNotSupported(f"{here}: {ref!r} does not point to a part of the schema.", param=here)
        return pointer, target_path, target

    def _def(self, pointer: str, target: Any, target_path: str) -> str:
        name = self._names.get(pointer)
        if name is None:
            base = self.prefix + (re.sub(r"[^a-zA-Z0-9]+", "-", pointer.rsplit("/", 1)[-1]).strip("-") or "root")
            name, i = base, 1
            while name in self._names.values():
                name, i = f"{base}-{i}", i + 1
            self._names[pointer] = name
            self._todo.append((name, target, target_path))
        return f"#/$defs/{name}"

    # leaves ----------------------------------------------------------------------------------
    def _valid(self, value: Any, n: dict[str, Any]) -> bool:
        return self.validator.evolve(schema=n).is_valid(value)

    def _leaf(self, n: dict[str, Any], path: str) -> Any:
        if "const" in n:
            if not self._valid(n["const"], n):
                raise _Unsatisfiable(f"{path}.const: the constant does not satisfy the rest of the schema.",
                                     param=f"{path}.const")
            return {"const": n["const"]}
        if "enum" in n:
            # The converter writes enum values as they are: keep those the rest of the schema allows.
            values = [v for v in n["enum"] if self._valid(v, n)]
            if not values:
                raise _Unsatisfiable(f"{path}.enum: no value of the enum satisfies the rest of the schema.",
                                     param=f"{path}.enum")
            return {"enum": values}
        if "type" in n:
            types = list(dict.fromkeys(n["type"] if isinstance(n["type"], list) else [n["type"]]))
            if "number" in types and "integer" in types:
                types.remove("integer")
        else:  # no type: the keywords say which kinds of value they constrain
            types = [t for t, kws in (("string", _STRING_KW), ("array", _ARRAY_KW), ("object", _OBJECT_KW))
                     if kws & n.keys()]
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
        return {"type": kind}

    def _string(self, n: dict[str, Any], path: str) -> dict[str, Any]:
        lo, hi, fmt = n.get("minLength"), n.get("maxLength"), n.get("format")
        if lo is not None and hi is not None and lo > hi:
            raise _Unsatisfiable(f"{path}: minLength is above maxLength.", param=f"{path}.minLength")
        bounded = lo is not None or hi is not None
        if "pattern" in n:
            if bounded or fmt in _FORMATS:
                raise SchemaNotSupported(f"{path}.pattern: a pattern cannot be combined with minLength, maxLength or "
                                         "format while generating; put the length into the pattern "
                                         "(e.g. ^[a-z]{1,20}$).", param=f"{path}.pattern")
            return {"type": "string", "x-pattern": pattern_gbnf(n["pattern"], f"{path}.pattern")}
        if fmt in _FORMATS:
            if bounded:
                raise SchemaNotSupported(f"{path}.format: format {fmt!r} fixes the text, so it cannot be combined "
                                         "with minLength or maxLength while generating.", param=f"{path}.format")
            return {"type": "string", "format": fmt}
        out: dict[str, Any] = {"type": "string"}
        if lo:
            out["minLength"] = lo
        if hi is not None:
            out["maxLength"] = hi
        return out

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
            raise _Unsatisfiable(f"{path}: no array satisfies minItems, maxItems and items together.",
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
                    raise _Unsatisfiable(f"{path}.properties.{name}: the property is required but its schema is "
                                         "false.", param=f"{path}.properties.{name}")
                continue  # never written
            out[name] = self.node(sub, f"{path}.properties.{name}")
        for name in required:
            if name not in props:
                if extra is False:
                    raise _Unsatisfiable(f"{path}.required: {name!r} is required, but it is not among the properties "
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
