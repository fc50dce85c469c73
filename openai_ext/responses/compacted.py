"""The content of a compaction item: this server's own, versioned encoding of a summary and of
the items kept word for word beside it. Opaque to clients, as OpenAI's encrypted_content is, but
not secret: it is compressed JSON, read back only by this server (compaction.py).

Since it is not signed, a client can send any content; reading one back costs at most what the
largest one this server makes costs. Its bounds are checked as it is read, before the next step:
the length of the content, then the size it unpacks to (the decompression stops as soon as it is
passed), then the number of kept items (before any of them is validated, in items.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.bodies import load_json
from ..core.errors import InvalidRequestError
from .item_types import Item, Items

PREFIX = "oec1."               # this server's compaction content, version 1

# What one compaction item may hold, unpacked. The server makes it from a summary of at most
# 1024 tokens (compaction.summary_tokens; SUMMARY_CHARS below bounds its text) and the newest
# items, kept while they fit a token budget of at most half the context; compaction.split also
# stops keeping them at KEPT_BYTES of JSON and MAX_KEPT items. Their text is bounded by tokens, but
# an image is kept whole (up to 1.5 MB, responses/images.STORED_CHARS): 8 MiB holds a few, and
# even incompressible (images) the item's content is about 11 MB, so that it always comes back in
# a request body of the default 16 MB (max_body_mb) beside the rest of the input.
MAX_DECODED = 8 * 2**20
# A kept item costs split at least five tokens of its budget: 2048 of them are some 10,000 tokens
# of nothing but tiny items, more than an agent's turns hold; past it, older items are summarised.
MAX_KEPT = 2048
SUMMARY_CHARS = 16_384         # 1024 tokens are a few thousand characters; escaped, 12 bytes each at most
KEPT_BYTES = MAX_DECODED - 12 * SUMMARY_CHARS - 1024   # room for the summary and the JSON around
# The longest content that unpacks within MAX_DECODED: deflate adds at most about 0.03% to data
# it cannot compress, base64 a third.
MAX_CONTENT = len(PREFIX) + 4 * ((MAX_DECODED + MAX_DECODED // 1000 + 64 + 2) // 3)
# What all the compaction items of one request may unpack to together. Everything before the
# latest one is replaced by it, so a client over this can leave the older ones out.
MAX_DECODED_TOTAL = 2 * MAX_DECODED
MAX_KEPT_TOTAL = 2 * MAX_KEPT


@dataclass
class Budget:
    """What the compaction items of one request may still unpack to, together."""
    decoded: int = MAX_DECODED_TOTAL
    kept: int = MAX_KEPT_TOTAL


def size(item: Item) -> int:
    """The bytes ``item`` takes in the content, unpacked (as ``encode`` writes it)."""
    return len(json.dumps(item, separators=(",", ":"))) + 1


class Kept(list):
    """Kept items with their part of the content packed already: made where the compaction is
    planned (the prepare thread), so that the item, made once the summary is written (on the
    event loop), costs only the summary's packing there."""

    def __init__(self, items: Items):
        super().__init__(items)
        self._packer = zlib.compressobj()
        head = self._packer.compress(b'{"kept":' + json.dumps(items, separators=(",", ":")).encode() + b',"summary":')
        whole = len(head) // 3 * 3          # base64 in groups of three bytes: the rest waits for the end
        self._text = base64.urlsafe_b64encode(head[:whole]).decode()
        self._rest = head[whole:]


def encode(summary: str, kept: Sequence[Item]) -> str:
    text = json.dumps(summary[:SUMMARY_CHARS]).encode() + b"}"
    if isinstance(kept, Kept):
        packer = kept._packer.copy()
        return PREFIX + kept._text + base64.urlsafe_b64encode(kept._rest + packer.compress(text) +
                                                              packer.flush()).decode()
    payload = b'{"kept":' + json.dumps(kept, separators=(",", ":")).encode() + b',"summary":' + text
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(payload)).decode()


def _refusal(param: str, why: str = "") -> InvalidRequestError:
    return InvalidRequestError(f"{param} is not a compaction made by this server{why}: send the compaction item as "
                               "it was returned (by /v1/responses/compact or a response with context_management), "
                               "unchanged.", param=param, code="invalid_encrypted_content")


def _over_budget(param: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: the compaction items of this request hold more than this server reads in "
                               f"one request ({MAX_DECODED_TOTAL // 2**20} MiB unpacked, {MAX_KEPT_TOTAL} kept items, "
                               "all of them together). Everything before the latest compaction item is replaced "
                               "by it: send only the latest one and the items after it.", param=param,
                               code="invalid_encrypted_content")


def _unpack(content: Any, param: str, limit: int) -> bytes | None:
    """The content's JSON text, or None when it unpacks to more than ``limit`` bytes; a 400 when
    it is not this server's encoding. Never more than ``limit`` + 1 bytes are unpacked."""
    if not isinstance(content, str) or not content.startswith(PREFIX):
        raise _refusal(param)
    if len(content) > MAX_CONTENT:
        raise _refusal(param, f" (it is {len(content)} characters long; one is {MAX_CONTENT} at most)")
    try:
        packed = base64.urlsafe_b64decode(content[len(PREFIX):].encode())
        unpack = zlib.decompressobj()
        raw = unpack.decompress(packed, limit + 1)
    except (binascii.Error, zlib.error, ValueError):
        raise _refusal(param) from None
    if len(raw) > limit or unpack.unconsumed_tail:
        return None
    if not unpack.eof:
        raise _refusal(param)
    return raw


def decode(content: Any, param: str, budget: Budget | None = None) -> tuple[str, list[Any]]:
    """The summary and the kept items of a compaction item, or a 400 naming it. ``budget``: what
    the request's compaction items may still unpack to (taken from as this one is read)."""
    limit = MAX_DECODED if budget is None else min(MAX_DECODED, budget.decoded)
    raw = _unpack(content, param, limit)
    if raw is None:
        if limit == MAX_DECODED:
            raise _refusal(param, f" (it unpacks to more than {MAX_DECODED // 2**20} MiB; one made here never does)")
        raise _over_budget(param)
    unpacked = len(raw)
    try:
        body = load_json(raw)
    except InvalidRequestError:
        raise _refusal(param) from None
    del raw
    summary = body.get("summary") if isinstance(body, dict) else None
    kept = body.get("kept") if isinstance(body, dict) else None
    if not isinstance(summary, str) or len(summary) > SUMMARY_CHARS or not isinstance(kept, list):
        raise _refusal(param)
    if len(kept) > MAX_KEPT:
        raise _refusal(param, f" (it keeps {len(kept)} items; one made here keeps {MAX_KEPT} at most)")
    if budget is not None:
        if len(kept) > budget.kept:
            raise _over_budget(param)
        budget.decoded -= unpacked
        budget.kept -= len(kept)
    return summary, kept
