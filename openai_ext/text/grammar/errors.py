"""The 400 for a schema the grammar cannot enforce."""

from __future__ import annotations

from ...core.errors import InvalidRequestError


class SchemaNotSupported(InvalidRequestError):
    pass
