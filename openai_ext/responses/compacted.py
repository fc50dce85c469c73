"""The content of a compaction item: this server's own, versioned encoding of a summary and of
the items kept word for word beside it. Opaque to clients, as OpenAI's encrypted_content is, but
not secret: it is compressed JSON, read back only by this server (compaction.py)."""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any

from ..core.errors import InvalidRequestError

PREFIX = "oec1."               # this server's compaction content, version 1
MAX_CONTENT = 20 * 2**20       # the spec's maxLength of encrypted_content
MAX_DECODED = 64 * 2**20       # what a compaction item may unpack to


def encode(summary: str, kept: list[dict[str, Any]]) -> str:
    payload = json.dumps({"summary": summary, "kept": kept}, separators=(",", ":")).encode()
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(payload)).decode()


def decode(content: Any, param: str) -> tuple[str, list[dict[str, Any]]]:
    """The summary and the kept items of a compaction item, or a 400 naming it."""
    bad = InvalidRequestError(f"{param} is not a compaction made by this server: send the compaction item as it was "
                              "returned (by /v1/responses/compact or a response with context_management), "
                              "unchanged.", param=param, code="invalid_encrypted_content")
    if not isinstance(content, str) or not content.startswith(PREFIX) or len(content) > MAX_CONTENT:
        raise bad
    try:
        packed = base64.urlsafe_b64decode(content[len(PREFIX):].encode())
        unpack = zlib.decompressobj()
        raw = unpack.decompress(packed, MAX_DECODED)
        if unpack.unconsumed_tail:
            raise bad
        body = json.loads(raw)
        summary, kept = body["summary"], body["kept"]
    except (binascii.Error, zlib.error, ValueError, KeyError, TypeError):
        raise bad from None
    if not isinstance(summary, str) or not isinstance(kept, list) or not all(isinstance(k, dict) for k in kept):
        raise bad
    return summary, kept
