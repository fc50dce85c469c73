"""The 400 for a schema the grammar cannot enforce."""

from __future__ import annotations

from typing import Any

from ...core.errors import InvalidRequestError


class SchemaNotSupported(InvalidRequestError):
    pass


# How deep a schema's JSON may nest (objects and lists). Real schemas stay far below it (ten levels
# of nested objects are about thirty); walking deeper ones would exhaust Python's recursion, in
# the schema validator as in the grammar converter.
MAX_SCHEMA_DEPTH = 64


def check_depth(schema: Any, where: str) -> None:
    """A 400 naming the limit for a schema nested deeper than MAX_SCHEMA_DEPTH. A loop, not
    recursion, so any depth is measured safely."""
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaNotSupported(f"{where} nests more than {MAX_SCHEMA_DEPTH} levels deep, this server's limit for "
                                     "a schema; flatten it (with $defs and $ref, for instance).", param=where)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
