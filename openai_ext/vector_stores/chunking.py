"""Static chunking, as OpenAI documents it: windows of ``max_chunk_size_tokens`` tokens (800 by
default) that overlap by ``chunk_overlap_tokens`` (400), counted in cl100k_base, the tokens OpenAI
counts in. Each chunk is also cut into pieces the embedding model reads whole (a sentence model
reads 256 of its own tokens and drops the rest): a chunk's vector is the mean of its pieces', so
the end of an 800-token chunk is found as well as its start.

The pieces lie on one grid over the whole text, whose step divides both the chunk's size and its
stride (100 tokens for 800 and 400): chunks that overlap share their pieces there, and ingestion
embeds each distinct piece once, so every token of the text is embedded once, not once per chunk
that holds it (twice, with the default overlap). A size and overlap with no such step of 48 to 160
tokens get pieces of their own per chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..documents.parse import Invalid

DEFAULT = {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400}
PIECE_TOKENS = 160   # cl100k tokens in one piece at most: under the default model's 256 word pieces
GRID_LEAST = 48      # a shared grid's step at least (below it, a chunk is cut on its own)
# A file's tokens at most (OpenAI's limit): it bounds a file's chunks (12,500 with the defaults), so
# a file's chunks are written, and removed, in one short transaction.
MOST_TOKENS = 5_000_000


@dataclass(frozen=True)
class Chunk:
    text: str
    pieces: list[str]


def strategy(requested: dict[str, Any] | None) -> dict[str, Any]:
    """The chunking_strategy object a vector store file reports (``auto`` is the default's)."""
    if requested is None or requested.get("type") == "auto":
        return {"type": "static", "static": dict(DEFAULT)}
    return {"type": "static", "static": {k: int(requested["static"][k]) for k in DEFAULT}}


def grid(size: int, step: int) -> int | None:
    """The pieces' step on a grid shared by all chunks: the largest divisor of both ``size`` and
    ``step`` up to PIECE_TOKENS (None: none of at least GRID_LEAST)."""
    common = math.gcd(size, step)
    found = max(d for d in range(1, min(common, PIECE_TOKENS) + 1) if common % d == 0)
    return found if found >= GRID_LEAST else None


def chunks(text: str, encoding: Any, size: int, overlap: int, *, name: str = "The file") -> list[Chunk]:
    tokens = encoding.encode_ordinary(text)   # "<|endoftext|>" in a file is text, not a token
    if len(tokens) > MOST_TOKENS:
        raise Invalid(f"{name} holds {len(tokens):,} tokens; a vector store file may hold at most "
                      f"{MOST_TOKENS:,} (OpenAI's limit). Split it into several files.")
    step = max(1, size - overlap)
    piece = grid(size, step) or PIECE_TOKENS
    out = []
    for start in range(0, max(1, len(tokens)), step):
        window = tokens[start:start + size]
        pieces = [_decode(encoding, window[i:i + piece]) for i in range(0, len(window), piece)]
        pieces = [p for p in pieces if p.strip()]
        if pieces:
            out.append(Chunk(_decode(encoding, window), pieces))
        if start + size >= len(tokens):
            break
    return out


def _decode(encoding: Any, tokens: list[int]) -> str:
    # a window's edge can fall inside a character's bytes: that character is dropped, not garbled
    return str(encoding.decode_bytes(tokens).decode("utf-8", "ignore"))
