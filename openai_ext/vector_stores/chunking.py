"""Static chunking, as OpenAI documents it: windows of ``max_chunk_size_tokens`` tokens (800 by
default) that overlap by ``chunk_overlap_tokens`` (400), counted in cl100k_base, the tokens OpenAI
counts in. Each chunk is also cut into pieces the embedding model reads whole (a sentence model
reads 256 of its own tokens and drops the rest): a chunk's vector is the mean of its pieces', so
the end of an 800-token chunk is found as well as its start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT = {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400}
PIECE_TOKENS = 160   # cl100k tokens in one piece: under the default model's 256 word pieces


@dataclass(frozen=True)
class Chunk:
    text: str
    pieces: list[str]


def strategy(requested: dict[str, Any] | None) -> dict[str, Any]:
    """The chunking_strategy object a vector store file reports (``auto`` is the default's)."""
    if requested is None or requested.get("type") == "auto":
        return {"type": "static", "static": dict(DEFAULT)}
    return {"type": "static", "static": {k: int(requested["static"][k]) for k in DEFAULT}}


def chunks(text: str, encoding: Any, size: int, overlap: int) -> list[Chunk]:
    tokens = encoding.encode_ordinary(text)   # "<|endoftext|>" in a file is text, not a token
    step = max(1, size - overlap)
    out = []
    for start in range(0, max(1, len(tokens)), step):
        window = tokens[start:start + size]
        pieces = [_decode(encoding, window[i:i + PIECE_TOKENS]) for i in range(0, len(window), PIECE_TOKENS)]
        pieces = [p for p in pieces if p.strip()]
        if pieces:
            out.append(Chunk(_decode(encoding, window), pieces))
        if start + size >= len(tokens):
            break
    return out


def _decode(encoding: Any, tokens: list[int]) -> str:
    # a window's edge can fall inside a character's bytes: that character is dropped, not garbled
    return str(encoding.decode_bytes(tokens).decode("utf-8", "ignore"))
