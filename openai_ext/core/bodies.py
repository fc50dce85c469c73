"""Checks on JSON text as a whole, made once before anything reads it: every JSON request body
(guards.BodyLimit, before any route parses it) and every WebSocket frame (``load_json``, which
the Responses socket and Realtime read their frames with). One helper, so a body and a frame are
held to the same rules and answered with the same words:

- Text that is not Unicode. JSON lets a string hold a lone UTF-16 surrogate (``"\\ud800"``), and
  Python's JSON reader turns the raw bytes of one (``ED A0 80``, invalid UTF-8) into the same.
  Such a string cannot be encoded again, so it would fail deep inside a tokenizer or an engine,
  as a 500 that the SDKs retry. It is refused with a 400 naming the field.
- Nesting deeper than MAX_DEPTH objects and lists. Python's JSON reader recurses once per level
  and fails somewhere near a thousand, depending on how deep the caller's stack already is; a
  fixed limit refuses the same text the same way wherever it is read.
- Numbers that are not finite. Python's reader takes ``NaN``, ``Infinity`` and ``-Infinity``,
  which JSON has not, and reads a number too large for a float (``1e999``) as infinity: a
  sampler given one, or a schema holding one, would fail later or quietly misbehave, and a reply
  echoing it would not be JSON. It is refused with a 400 naming the field.

Ordinary text pays for a few scans of its bytes in C (a UTF-8 check, substring searches, a
bracket count); the text is parsed again, with hooks, only when those bytes could hold a problem.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from .errors import InvalidRequestError

# How deep objects and lists may nest in a body or a frame. No request needs a tenth of it: the
# deepest real content is a JSON schema (tools, structured output), which the grammar limits to
# 64 levels (text/grammar/errors.MAX_SCHEMA_DEPTH: its own 400 names that limit) in a body a few
# levels deep. And it is well within what Python's reader parses on any thread (its recursion
# limit is 1000 frames, the caller's included).
MAX_DEPTH = 512
# Text longer than this is best checked on a worker thread, not the event loop: the checks cost a
# few milliseconds per megabyte (about what parsing it costs).
ON_THREAD = 256 * 1024

# A \u escape of a surrogate, in either case. A pair is fine; the check below tells a pair from a
# lone half on the parsed text, so this only has to find candidates cheaply.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# Numbers that may not be finite, looked for outside strings with digits made '0' and 'E' made
# 'e': any number with an exponent (1e400, and a long mantissa with a small one: 1 and 300 zeros,
# e10), or 309 digits in a row (a float written out that long is too large as well). A finite
# one (1e-5) only costs parsing the text once more; outside strings, "e" after a digit is only
# ever an exponent (true and false put it after a letter).
_DIGITS = bytes.maketrans(b"123456789E", b"000000000e")
_NUMBER_HINTS = (b"NaN", b"Infinity", b"0e", b"0" * 309)
# Above this many quotes, outside_strings cuts the text with arrays instead of splitting it.
_FEW_QUOTES = 65_536
# Every byte but the brackets (deleted before they are counted), and a bracket's weight, by byte.
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_NESTING = np.zeros(256, dtype=np.int8)
_NESTING[[ord("["), ord("{")]] = 1
_NESTING[[ord("]"), ord("}")]] = -1


class _NotFinite:
    """Stands for a non-finite number while the text is parsed again, so its path can be found."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


def _is_lone(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _find(doc: Any) -> tuple[str, Any] | None:
    """The path of the first string (key or value) holding a lone surrogate, or of the first
    non-finite number, and what is there. A loop, not recursion."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _NotFinite):
            return path, node
        if isinstance(node, str):
            if _is_lone(node):
                return path, node
        elif isinstance(node, dict):
            for key in node:
                if _is_lone(key):
                    return (f"{path}.{key}" if path else "<key>"), key
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node))))
    return None


def outside_strings(text: bytes) -> bytes:
    """JSON text with its strings taken out: what is left is brackets, numbers, literals and
    punctuation, usually a small part of it. In JSON a backslash always starts an escape, so
    removing the escaped backslashes, then the escaped quotes, leaves only the quotes that open
    and close strings; every other piece between them is a string. Text of many short strings is
    cut with array operations rather than into as many pieces."""
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    if text.count(b'"') <= _FEW_QUOTES:
        return b"".join(text.split(b'"')[::2])
    data = np.frombuffer(text, dtype=np.uint8)
    quotes = data == ord('"')
    inside = np.cumsum(quotes, dtype=np.uint8) & 1   # after an odd number of quotes (the count wraps: its parity holds)
    inside |= quotes
    return data[inside == 0].tobytes()


def too_deep(rest: bytes) -> bool:
    """Whether objects and lists nest more than MAX_DEPTH deep, given the text outside strings
    (``outside_strings``)."""
    brackets = rest.translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= MAX_DEPTH:   # it cannot open more than it holds
        return False
    steps = _NESTING[np.frombuffer(brackets, dtype=np.uint8)].astype(np.int32)
    return int(np.cumsum(steps).max()) > MAX_DEPTH


def _too_deep() -> InvalidRequestError:
    return InvalidRequestError(f"The JSON nests objects and lists more than {MAX_DEPTH} levels deep, this server's "
                               "limit. Send flatter JSON.", code="invalid_json")


def _not_utf8() -> InvalidRequestError:
    return InvalidRequestError("The JSON text is not valid UTF-8. Send JSON text encoded as UTF-8.",
                               code="invalid_json")


def _refusal(where: str, found: Any) -> InvalidRequestError:
    param = where or None
    name = where or "The JSON text"
    if isinstance(found, _NotFinite):
        shown = found.text if len(found.text) <= 40 else found.text[:20] + "..." + found.text[-8:]
        return InvalidRequestError(f"{name} is {shown}, which is not a finite number: JSON has no NaN or Infinity, "
                                   "and a number beyond about 1.8e308 overflows to infinity. Send a finite number.",
                                   param=param, code="invalid_value")
    return InvalidRequestError(f"{name} holds a lone UTF-16 surrogate (such as \\ud800), which is not a Unicode "
                               "character. Send valid Unicode text (surrogates only in pairs).", param=param)


def _suspect_numbers(rest: bytes) -> bool:
    """Whether the text outside strings could hold a non-finite number."""
    digits = rest.translate(_DIGITS)
    return any(hint in digits for hint in _NUMBER_HINTS)


def _parse(text: bytes, *, numbers: bool) -> tuple[Any, bool]:
    """The parsed text, and whether it holds a non-finite number (looked for when ``numbers``)."""
    if not numbers:
        return json.loads(text), False
    seen: list[bool] = []

    def constant(token: str) -> _NotFinite:
        seen.append(True)
        return _NotFinite(token)

    def number(token: str) -> Any:
        value = float(token)
        if math.isfinite(value):
            return value
        seen.append(True)
        return _NotFinite(token)

    return json.loads(text, parse_constant=constant, parse_float=number), bool(seen)


class NotJson(InvalidRequestError):
    """Text that the JSON reader refuses; ``reason`` is the reader's own words."""

    def __init__(self, reason: str):
        super().__init__(f"The text is not valid JSON ({reason}).", code="invalid_json")
        self.reason = reason


def _checked(text: bytes, *, parse: bool) -> Any:
    """The checks, and the parsed text when ``parse`` (else None, and text that is not JSON is
    left to the reader that comes next, which says what is wrong)."""
    try:
        text.decode("utf-8")
        raw_ok = True
    except UnicodeDecodeError:
        raw_ok = False
    rest = outside_strings(text)
    if too_deep(rest):
        raise _too_deep()
    surrogates = not raw_ok or _SURROGATE_ESCAPE.search(text) is not None
    numbers = _suspect_numbers(rest)
    del rest
    if not (surrogates or numbers or parse):
        return None
    try:
        doc, not_finite = _parse(text, numbers=numbers)
    except (ValueError, RecursionError) as e:
        if not raw_ok:
            raise _not_utf8() from None
        if parse:
            raise NotJson(str(e) if isinstance(e, ValueError) else "nested too deeply") from None
        return None
    if surrogates or not_finite:
        found = _find(doc)
        if found is not None:
            raise _refusal(*found)
    if not raw_ok:
        raise _not_utf8()
    return doc


def check_json_text(body: bytes) -> None:
    """Raises a 400 when a JSON body holds a lone surrogate (escaped or raw), a non-finite number
    (naming the field), is not UTF-8, or nests deeper than MAX_DEPTH. Text that is not JSON is
    left to the route's parser."""
    _checked(body, parse=False)


def load_json(text: str | bytes) -> Any:
    """A WebSocket frame's JSON, held to the rules a request body is (``check_json_text``); text
    that is not JSON is a ``NotJson``, which a socket words its own way."""
    return _checked(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text, parse=True)
