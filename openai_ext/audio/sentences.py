"""Text cut into the pieces that speech synthesizes one after another: sentences (and
paragraphs), never cut after a common abbreviation or an initial, over-long ones cut at a clause,
so audio starts soon even for a long input."""

from __future__ import annotations

import re

MAX_PIECE_CHARS = 400               # longer sentences are cut at a clause, so audio still starts soon

# Whitespace after a sentence's last mark (and any closing quotes or brackets), or a blank line.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?…。！？])|(?<=[.!?…。！？][\"'”’)\]])|(?<=[.!?…。！？][\"'”’)\]]{2}))\s+"
                           r"|\n\s*\n")
_ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "prof.", "sr.", "jr.", "st.", "vs.", "e.g.", "i.e.", "etc.", "no.",
                  "fig.", "approx.", "inc.", "ltd.", "co.", "mt."}
_CLAUSE_END = re.compile(r"[,;:—–)]\s")


def _ends_with_abbreviation(piece: str) -> bool:
    last = piece.rstrip().rsplit(None, 1)[-1].lower() if piece.strip() else ""
    return last in _ABBREVIATIONS or bool(re.fullmatch(r"[a-z]\.", last))   # an initial, as in "J. Smith"


def _cut_long(piece: str, limit: int) -> list[str]:
    out = []
    while len(piece) > limit:
        window = piece[:limit]
        clause = [m.end() for m in _CLAUSE_END.finditer(window)]
        cut = clause[-1] if clause else (window.rfind(" ") + 1 or limit)
        out.append(piece[:cut].strip())
        piece = piece[cut:].strip()
    return out + ([piece] if piece else [])


def split_sentences(text: str, limit: int = MAX_PIECE_CHARS) -> list[str]:
    """``text`` in the pieces that are synthesized one after another: sentences (and paragraphs),
    never cut after a common abbreviation or an initial, with over-long ones cut at a clause."""
    pieces: list[str] = []
    pending = ""
    for part in _SENTENCE_END.split(text):
        pending = f"{pending} {part}" if pending else part
        if not _ends_with_abbreviation(pending):
            pieces.append(pending)
            pending = ""
    if pending:
        pieces.append(pending)
    return [cut for piece in pieces if piece.strip() for cut in _cut_long(" ".join(piece.split()), limit)]
