"""``input_file`` parts of a Responses input: a file the model reads as text.

A part's file is read as text (files/parts.py) before the request is prepared, and the part is
kept as an ``input_text`` part holding the file's name and text: the model reads it, a chain shows
it again, and the stored input needs the file no longer.
"""

from __future__ import annotations

from typing import Any

from ..documents.inputs import Budget, Reader, part_text

Key = tuple[int, str, int]   # (item, "content" or "output", part)


def _parts(raw: Any) -> list[tuple[Key, dict[str, Any]]]:
    out: list[tuple[Key, dict[str, Any]]] = []
    if not isinstance(raw, list):
        return out
    for i, item in enumerate(raw):
        for key in ("content", "output"):
            parts = item.get(key) if isinstance(item, dict) else None
            if isinstance(parts, list):
                out += [((i, key, j), p) for j, p in enumerate(parts)
                        if isinstance(p, dict) and p.get("type") == "input_file"]
    return out


async def file_texts(raw: Any, owner: str, reader: Reader | None, context_tokens: int) -> dict[Key, str]:
    """The text each input_file part of ``raw`` stands for (a 400 or 404 naming the part), within
    one budget for the request (documents/inputs.py)."""
    budget = Budget(context_tokens)
    return {key: await part_text(part, f"input[{key[0]}].{key[1]}[{key[2]}]", owner, reader, budget)
            for key, part in _parts(raw)}


def inlined(raw: Any, texts: dict[Key, str]) -> Any:
    """``raw`` with each input_file part replaced by the input_text part of its text."""
    if not texts:
        return raw
    out = [dict(item) if isinstance(item, dict) else item for item in raw]
    for (i, key, j), text in texts.items():
        parts = list(out[i][key])
        parts[j] = {"type": "input_text", "text": text}
        out[i][key] = parts
    return out
