"""JSON Schema to GBNF grammar, for structured output and tool calls.

``rewrite`` puts a schema into shapes the converter handles exactly (a 400 names what cannot be
enforced), ``patterns`` writes regular expressions as grammar, ``converter`` turns prepared
schemas into GBNF.
"""

from .converter import JSON_OBJECT_SCHEMA, gbnf, schema_to_gbnf
from .errors import SchemaNotSupported
from .patterns import gbnf_literal, pattern_gbnf
from .rewrite import Prepared, prepare

__all__ = ["JSON_OBJECT_SCHEMA", "Prepared", "SchemaNotSupported", "gbnf", "gbnf_literal",
           "pattern_gbnf", "prepare", "schema_to_gbnf"]
