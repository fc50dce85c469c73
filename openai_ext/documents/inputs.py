"""A file given in a request as input (Responses' ``input_file`` part, chat's ``file`` part): its
bytes, from the Files API by ``file_id`` (the caller's own) or sent as ``file_data`` (base64 or a
data URL, with its ``filename``), and its text as vector stores read files (text, code, Markdown,
JSON, HTML, PDF: parse.py), read on a worker thread. ``file_url`` gets a 400: this
server fetches nothing. The families name where the part is; the Files API's read is handed in.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Awaitable, Callable

import anyio

from ..core.errors import InvalidRequestError, NotFoundError
from .parse import Invalid, Unsupported, extract

MAX_BYTES = 50 * 2 ** 20   # OpenAI's limit on a file given as input
# file id, owner, most bytes -> its name, and its content (None: it has more than that many bytes)
Reader = Callable[[str, str, int], Awaitable[tuple[str, "bytes | None"]]]


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


async def part_text(part: dict[str, Any], where: str, owner: str, reader: Reader | None) -> str:
    """The text the model reads for the file of ``part`` (at ``where``): its name and its text."""
    name, data = await _content(part, where, owner, reader)
    try:
        text = await anyio.to_thread.run_sync(extract, data, name)
    except (Unsupported, Invalid) as e:
        raise _bad(where, f"{where}: {e}") from None
    return f"File {name}:\n{text}"


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
