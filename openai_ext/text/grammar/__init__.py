"""JSON Schema to GBNF grammar, for structured output and tool calls.

``rewrite`` puts a schema into shapes the converter handles exactly (a 400 names what a strict
schema asks that cannot be enforced; a non-strict one is relaxed there and validated after
generation), ``leaves`` holds those shapes, ``patterns`` reads regular expressions, ``automata``
combines several with lengths, ``numbers`` writes numeric ranges, ``repeat`` writes counts, and
``converter`` turns prepared schemas into GBNF. ``limits`` bounds the work of any schema.
"""

from .converter import JSON_OBJECT_SCHEMA, Grammar, schema_to_gbnf, write_schema
from .errors import SchemaNotSupported
from .limits import Budget, OverBudget
from .patterns import gbnf_literal, pattern_gbnf
from .rewrite import Prepared, loose, prepare

__all__ = ["JSON_OBJECT_SCHEMA", "Budget", "Grammar", "OverBudget", "Prepared", "SchemaNotSupported", "gbnf_literal",
           "loose", "pattern_gbnf", "prepare", "schema_to_gbnf", "write_schema"]
