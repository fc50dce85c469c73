"""JSON Schema rewritten into the plain shapes the grammar converter handles exactly.

The converter silently ignores what it does not implement: keywords such as ``minimum``, but also
keywords it knows in combinations it does not handle (``enum`` under a list of types, ``required``
names missing from ``properties``, ``minItems`` without ``items``, siblings of ``anyOf`` or
``$ref`` ...). A grammar that ignored part of a schema could produce output that fails it. So every
schema is first rewritten (``prepare``): ``allOf`` and the siblings of ``anyOf``/``oneOf``/``$ref``
are merged in, type lists become ``anyOf`` with the keywords of each type, enum values are kept
only when they satisfy the rest of the schema, and references are renamed so several schemas can
share one grammar.

What the grammar cannot enforce (``cannot``) is a 400 naming where it is for a strict schema, as
OpenAI refuses it. Any other schema is enforced as far as the grammar can: the part is left out of
the grammar (``Prepared.relaxed`` names it) and whatever is generated is validated against the
whole schema afterwards (a tool call that fails is not a call). That covers keywords the grammar
does not know, conflicting parts, patterns it cannot read, and schemas beyond the request's
``limits``: rewriting and writing any schema is bounded work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from ...core.errors import PARAM
from .errors import SchemaNotSupported, check_depth, check_schema
from .leaves import ARRAY_KW, MORE_PATTERNS, NUMBER_KW, OBJECT_KW, STRING_KW, Checker, Leaves, Unsatisfiable
from .limits import MAX_BRANCHES, Budget, OverBudget

# Keywords the grammar enforces.
_ENFORCED = (STRING_KW | ARRAY_KW | OBJECT_KW | NUMBER_KW
             | {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"})
# Keywords that describe and do not constrain, or that only hold definitions.
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated",
                "readOnly", "writeOnly", "$defs", "definitions", "strict", "contentMediaType",
                "contentEncoding", "$anchor", "$vocabulary",   # and OpenAPI's (nullable: see node())
                "example", "discriminator", "nullable", "externalDocs", "xml"}
_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_MAX_INLINE = 32          # references merged into their siblings, one inside the other


@dataclass
class Prepared:
    """A schema in the shapes the converter handles exactly; its references point into ``defs``.
    ``relaxed``: where the grammar enforces less than the schema asks (a non-strict schema)."""
    schema: Any
    defs: dict[str, Any]
    relaxed: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """Whether everything the grammar allows is valid under the schema."""
        return not self.relaxed


def loose(schema: Any, where: str) -> Prepared:
    """The grammar of any value of the schema's type (any object, for a tool's parameters): for
    a non-strict schema the grammar cannot take; what is generated is validated afterwards."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    return Prepared({"type": kind} if isinstance(kind, str) and kind in _TYPES else {}, {}, [where])


def prepare(schema: Any, where: str, *, prefix: str = "", strict: bool = True, budget: Budget | None = None,
            checked: bool = False) -> Prepared:
    """Checks ``schema`` and rewrites it for the converter. ``prefix`` keeps the names of its
    definitions apart from those of other schemas. ``strict`` (a strict tool or json_schema): a
    keyword the grammar cannot enforce is a 400 naming it; otherwise it is left out of the grammar
    and the rest is enforced, as OpenAI accepts non-strict schemas. ``budget``: the request's
    allowance (see limits), shared by its schemas. ``checked``: the schema was already found
    valid (tools.parse checks each function's)."""
    if not checked:
        check_depth(schema, where)
        if isinstance(schema, (dict, bool)):
            check_schema(schema, where)
    rewriter = _Rewriter(schema, where, prefix, strict, budget or Budget())
    try:
        return Prepared(rewriter.run(), rewriter.defs, rewriter.relaxed)
    except (RecursionError, OverBudget) as e:
        what = "nests too deeply" if isinstance(e, RecursionError) else f"needs {e}"
        here = getattr(e, "path", None) or where
        if strict:
            at = f" (it ran out at {PARAM})" if here != where else ""
            raise SchemaNotSupported(f"{{schema}} {what} to be turned into a grammar{at}; this server's limits keep "
                                     "any schema quick to prepare (see the README).", param=here,
                                     paths={"schema": where}) from None
        return loose(schema, where)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 equals 1.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _type_meet(a: Any, b: Any) -> list[str]:
    left, right = set(a if isinstance(a, list) else [a]), set(b if isinstance(b, list) else [b])
    out = left & right
    if ("integer" in left and "number" in right) or ("number" in left and "integer" in right):
        out.add("integer")
    return sorted(out)


class _Rewriter(Leaves):
    def __init__(self, root: Any, where: str, prefix: str, strict: bool, budget: Budget):
        self.root, self.where, self.prefix, self.strict, self.budget = root, where, prefix, strict, budget
        self.validator = Checker(root if isinstance(root, (dict, bool)) else {})
        self.defs: dict[str, Any] = {}
        self.relaxed: list[str] = []
        self._names: dict[str, str] = {}            # JSON pointer -> name in defs
        self._todo: list[tuple[str, Any, str]] = []

    def cannot(self, path: str, message: str) -> None:
        """Something at ``path`` the grammar cannot enforce: a 400 for a strict schema; otherwise
        the caller leaves it out of the grammar, and the output is validated afterwards."""
        if self.strict:
            raise SchemaNotSupported(message, param=path)
        if path not in self.relaxed[-1:]:
            self.relaxed.append(path)

    def run(self) -> Any:
        out = self.node(self.root, self.where)
        while self._todo:
            name, target, path = self._todo.pop()
            self.defs[name] = self.node(target, path)
        return out

    # a node and its combinators --------------------------------------------------------------
    def node(self, n: Any, path: str, depth: int = 0) -> Any:
        self.budget.step(path=path)
        if depth > _MAX_INLINE:
            self.cannot(path, f"{path}: its references and allOf parts nest too deeply (or loop) to be merged.")
            return {}
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
            self.cannot(f"{path}.oneOf", f"{path}: anyOf and oneOf side by side cannot be enforced; keep one of them.")
            n = {k: v for k, v in n.items() if k != "oneOf"}
        for key in ("anyOf", "oneOf"):
            if key in n:
                return self._union(n, key, path, depth)
        return self._leaf(n, path)

    def _plain(self, n: Any, path: str) -> dict[str, Any]:
        """``n`` as a dict of enforced keywords (a 400 for any other keyword)."""
        if n is True:
            return {}
        if n is False:
            raise Unsatisfiable(f"{path} is the schema false, which no value satisfies.", param=path)
        if not isinstance(n, dict):
            raise SchemaNotSupported(f"{path} must be a JSON Schema object.", param=path)
        for key, value in n.items():
            if key == MORE_PATTERNS:
                continue   # patterns of parts merged earlier
            here = f"{path}.{key}"
            if key in _ANNOTATIONS or key.startswith("x-"):
                continue
            if key not in _ENFORCED:
                self.cannot(here, f"{here}: the keyword '{key}' cannot be enforced while generating. Remove it from "
                                  f"the schema (supported: {', '.join(sorted(_ENFORCED))}).")
                continue
            if key == "type":
                bad = [k for k in (value if isinstance(value, list) else [value]) if k not in _TYPES]
                if bad:
                    raise SchemaNotSupported(f"{here}: unknown type {bad[0]!r}.", param=here)
        return {k: v for k, v in n.items() if k in _ENFORCED or k == MORE_PATTERNS}

    def _inline(self, n: Any, path: str, depth: int) -> dict[str, Any]:
        """``n`` with its own reference (if any) merged in, ready to be merged with siblings."""
        self.budget.step(path=path)
        if depth > _MAX_INLINE:
            self.cannot(path, f"{path}: its references nest too deeply (or loop) to be merged.")
            return {}
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
        if len(n[key]) > MAX_BRANCHES:
            self.cannot(f"{path}.{key}", f"{path}.{key}: more than {MAX_BRANCHES} branches are more than this server "
                                         "follows at once while generating.")
            return self.node(rest, path, depth + 1)
        branches, last_error = [], None
        for i, branch in enumerate(n[key]):
            here = f"{path}.{key}[{i}]"
            try:
                merged = self._merge(rest, self._inline(branch, here, depth + 1), here) if rest else branch
                branches.append(self.node(merged, here, depth + 1))
            except Unsatisfiable as e:
                last_error = e
        if not branches:
            raise last_error or Unsatisfiable(f"{path}.{key}: no branch can be satisfied.", param=f"{path}.{key}")
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def _merge(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        """A schema for values that satisfy both ``a`` and ``b`` (both without $ref)."""
        out: dict[Any, Any] = dict(a)
        objects = bool(OBJECT_KW & a.keys() and OBJECT_KW & b.keys())
        if objects:
            out = {k: v for k, v in out.items() if k not in OBJECT_KW}
            out.update(self._merge_objects(a, b))
        for key, value in b.items():
            if objects and key in OBJECT_KW:
                continue  # merged above
            if key not in out or _same(out[key], value):
                out[key] = value
            elif key == "type":
                out[key] = _type_meet(out[key], value)
                if not out[key]:
                    raise Unsatisfiable(f"{path}.type: no type satisfies every part of the schema.",
                                         param=f"{path}.type")
            elif key == "enum":
                out[key] = [v for v in out[key] if any(_same(v, w) for w in value)]
                if not out[key]:
                    raise Unsatisfiable(f"{path}.enum: no value is in every enum.", param=f"{path}.enum")
            elif key == "const":
                raise Unsatisfiable(f"{path}.const: two different constants.", param=f"{path}.const")
            elif key in ("minLength", "minItems", "minimum", "exclusiveMinimum"):
                out[key] = max(out[key], value)
            elif key in ("maxLength", "maxItems", "maximum", "exclusiveMaximum"):
                out[key] = min(out[key], value)
            elif key == "pattern":     # both must match: the string leaf combines them
                out[MORE_PATTERNS] = [*out.get(MORE_PATTERNS, []), value]
            elif key == MORE_PATTERNS:
                out[key] = [*out[key], *value]
            elif key == "items":
                out[key] = {"allOf": [out[key], value]}
            elif key == "allOf":
                out[key] = [*out[key], *value]
            else:
                self.cannot(f"{path}.{key}", f"{path}.{key}: parts of this schema give different '{key}' values, "
                                             "which cannot be combined while generating.")
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
