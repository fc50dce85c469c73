"""Checking a call's arguments against its function's schema, in bounded time.

jsonschema matches ``pattern`` with Python's ``re``, which backtracks: a hostile pattern (nested
repetition) on a string the model wrote can take hours, and it holds the GIL meanwhile, so the
whole server would stop. Here a pattern is matched first in linear time (the grammar's own
automaton, which reads most patterns); the few it cannot read (lookarounds, back-references) go to
the ``regex`` engine under a time limit, shared by all the patterns of one call. A pattern that
runs out of time counts as not matched: the call is then treated as one that does not validate.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import regex
from jsonschema import Draft202012Validator, ValidationError, validators

from ..grammar.automata import search

log = logging.getLogger(__name__)

PATTERN_SECONDS = 0.25      # for all the patterns of one call's arguments

_deadline = threading.local()


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any):
    if not validator.is_type(instance, "string"):
        return
    if search(pattern, instance):
        return   # (a match found in linear time is a match in any engine)
    left = getattr(_deadline, "at", time.monotonic() + PATTERN_SECONDS) - time.monotonic()
    try:
        matched = left > 0 and regex.search(pattern, instance, timeout=left) is not None
    except TimeoutError:
        log.warning("matching %r against a %d-character string ran out of time", pattern[:80], len(instance))
        matched = False
    except regex.error:
        matched = False
    if not matched:
        yield ValidationError(f"{instance[:80]!r} does not match {pattern!r}")


CallValidator = validators.extend(Draft202012Validator, {"pattern": _pattern})


def is_valid(validator: Any, arguments: Any) -> bool:
    """Whether ``arguments`` satisfy the schema of ``validator`` (a CallValidator), the patterns
    checked within PATTERN_SECONDS in all."""
    _deadline.at = time.monotonic() + PATTERN_SECONDS
    try:
        return validator.is_valid(arguments)
    finally:
        del _deadline.at
