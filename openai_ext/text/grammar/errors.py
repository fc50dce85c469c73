"""The 400 for a schema the grammar cannot enforce, and the checks every schema passes first."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ...core.errors import PARAM, InvalidRequestError


class SchemaNotSupported(InvalidRequestError):
    """A schema the grammar cannot enforce. Every message of this package starts with the path it
    names, its param; that start is made the message's {param} slot, so a family that names the
    schema its own way (Messages' input_schema) renames the param and the message follows."""

    def __init__(self, message: str, *, param: str | None = None, **kw: Any):
        if param and message.startswith(param):
            message = PARAM + message[len(param):]
        super().__init__(message, param=param, **kw)


# How deep a schema's JSON may nest (objects and lists). Real schemas stay far below it (ten levels
# of nested objects are about thirty); walking deeper ones would exhaust Python's recursion, in
# the schema validator as in the grammar converter.
MAX_SCHEMA_DEPTH = 64
# How many objects and lists one request's schemas may hold together. Checking a schema against
# JSON Schema's own metaschema costs about a fifth of a millisecond per object, so this bounds that
# check to a second or two; a coding agent's whole tool set holds a few thousand at most.
MAX_SCHEMA_NODES = 10_000


def check_depth(schema: Any, where: str, *, room: int = MAX_SCHEMA_NODES) -> int:
    """A 400 naming the limit for a schema nested deeper than MAX_SCHEMA_DEPTH, or holding more
    than ``room`` objects and lists; otherwise how many it holds. A loop, not recursion, so any
    depth is measured safely."""
    stack = [(schema, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaNotSupported(f"{where} nests more than {MAX_SCHEMA_DEPTH} levels deep, this server's limit for "
                                     "a schema; flatten it (with $defs and $ref, for instance).", param=where)
        if isinstance(node, (dict, list)):
            nodes += 1
            if nodes > room:
                raise SchemaNotSupported(f"{where}: the request's schemas hold more than {MAX_SCHEMA_NODES} objects "
                                         "and lists together, this server's limit (it keeps checking them quick).",
                                         param=where)
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return nodes


_valid: OrderedDict[bytes, None] = OrderedDict()   # digests of schemas found valid, most recent last
_valid_lock = threading.Lock()


def check_schema(schema: Any, where: str) -> None:
    """A 400 naming where ``schema`` breaks JSON Schema (2020-12). Schemas found valid are
    remembered (a few hundred): clients send the same tools with every request."""
    try:
        key = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).digest()
    except ValueError:   # NaN, or an integer too long to write: checked every time
        key = b""
    with _valid_lock:
        if key in _valid:
            _valid.move_to_end(key)
            return
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        here = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        raise SchemaNotSupported(f"{here} is not a valid JSON Schema: {e.message}", param=here) from None
    with _valid_lock:
        if key:
            _valid[key] = None
        while len(_valid) > 256:
            _valid.popitem(last=False)
