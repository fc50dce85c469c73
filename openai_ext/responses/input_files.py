"""``input_file`` parts of a Responses input: a file the model reads as text.

A part names an uploaded file (``file_id``, read from the Files API as the caller's) or carries it
(``file_data``, base64 or a data URL, with its ``filename``); ``file_url`` gets a 400, as this
server fetches nothing. Its text is read as vector stores read files (text, code, Markdown, JSON,
HTML, PDF: vector_stores/parse.py) before the request is prepared, on a worker thread, and the
part is kept as an ``input_text`` part holding the file's name and text: the model reads it, a
chain shows it again, and the stored input needs the file no longer.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Awaitable, Callable

import anyio

from ..core.errors import InvalidRequestError, NotFoundError
from ..vector_stores.parse import Invalid, Unsupported, extract

MAX_BYTES = 50 * 2 ** 20   # OpenAI's limit on a file given as input
Key = tuple[int, str, int]   # (item, "content" or "output", part)
# file id, owner, most bytes -> its name, and its content (None: it has more than that many bytes)
Reader = Callable[[str, str, int], Awaitable[tuple[str, "bytes | None"]]]


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


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


async def file_texts(raw: Any, owner: str, reader: Reader | None) -> dict[Key, str]:
    """The text each input_file part of ``raw`` stands for (a 400 or 404 naming the part)."""
    found = {}
    for key, part in _parts(raw):
        where = f"input[{key[0]}].{key[1]}[{key[2]}]"
        name, data = await _content(part, where, owner, reader)
        try:
            text = await anyio.to_thread.run_sync(extract, data, name)
        except (Unsupported, Invalid) as e:
            raise _bad(where, f"{where}: {e}") from None
        found[key] = f"File {name}:\n{text}"
    return found


async def _content(part: dict[str, Any], where: str, owner: str, reader: Reader | None) -> tuple[str, bytes]:
    if part.get("file_url") is not None:
        raise _bad(f"{where}.file_url", f"{where} has a file_url; this server fetches nothing. Upload the file "
                                        "(POST /v1/files) and send its file_id, or send its file_data.")
    file_id, data = part.get("file_id"), part.get("file_data")
    if isinstance(file_id, str):
        if reader is None:
            raise _bad(f"{where}.file_id", "This server keeps no files; send the file's file_data.")
        try:
            name, found = await reader(file_id, owner, MAX_BYTES)
        except NotFoundError:
            raise NotFoundError(f"File with id '{file_id}' not found.", param=f"{where}.file_id") from None
        content = b"\0" * (MAX_BYTES + 1) if found is None else found   # (too large: refused below)
    elif isinstance(data, str):
        filename = part.get("filename")
        if not isinstance(filename, str) or not filename:
            raise _bad(f"{where}.filename", f"{where} has file_data and needs its filename (the name tells how to "
                                            "read it: report.pdf, notes.md).")
        name = filename
        try:
            content = base64.b64decode(data.split(",", 1)[1] if data.startswith("data:") else data, validate=True)
        except (binascii.Error, ValueError, IndexError):
            raise _bad(f"{where}.file_data", f"{where}.file_data must be the file, base64-encoded (or a data URL "
                                             "of it).") from None
    else:
        raise _bad(where, f"{where} is an input_file part and needs a file_id or its file_data.")
    if len(content) > MAX_BYTES:
        raise _bad(where, f"{where} is over 50 MB, the most a file given as input may be. "
                          "Add it to a vector store and use file_search instead.")
    return name, content


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
