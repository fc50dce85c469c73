"""Checks on a JSON request body as a whole, made once before any route parses it.

Text that is not Unicode: JSON lets a string hold a lone UTF-16 surrogate (``"\\ud800"``), and
Python's JSON reader turns the raw bytes of one (``ED A0 80``, invalid UTF-8) into the same. Such a
string cannot be encoded again, so it would fail deep inside a tokenizer or an engine, as a 500
that the SDKs retry. It is refused here with a 400 naming the field, for every route at once.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import InvalidRequestError

# A \u escape of a surrogate, in either case. A pair is fine; the check below tells a pair from a
# lone half on the parsed text, so this only has to find candidates cheaply.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _is_lone(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _find(doc: Any) -> str | None:
    """The path of the first string (key or value) that holds a lone surrogate. A loop, not
    recursion: a body may nest as deep as the JSON reader allows."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _is_lone(node):
                return path
        elif isinstance(node, dict):
            for key in node:
                if _is_lone(key):
                    return f"{path}.{key}" if path else "<key>"
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node))))
    return None


def check_json_text(body: bytes) -> None:
    """Raises a 400 naming the field when the body's text holds a lone surrogate, escaped or raw.

    Linear in the body's size; the walk over the parsed body only happens when the bytes hold a
    candidate, so ordinary bodies pay one regular-expression scan and one UTF-8 check."""
    try:
        body.decode("utf-8")
        raw_ok = True
    except UnicodeDecodeError:
        raw_ok = False
    if raw_ok and not _SURROGATE_ESCAPE.search(body):
        return
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        if raw_ok:
            return  # not JSON: the route's own parser says what is wrong
        raise InvalidRequestError("The request body is not valid UTF-8. Send JSON text encoded as UTF-8.")
    where = _find(doc)
    if where is not None:
        raise InvalidRequestError(f"{where} holds a lone UTF-16 surrogate (such as \\ud800), which is not a "
                                  "Unicode character. Send valid Unicode text (surrogates only in pairs).",
                                  param=where)
    if not raw_ok:
        raise InvalidRequestError("The request body is not valid UTF-8. Send JSON text encoded as UTF-8.")
