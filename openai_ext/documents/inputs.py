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

MAX_BYTES = 50 * 2 ** 20   # OpenAI's limit on the files given as input
CHARS_PER_TOKEN = 8        # text longer than this many characters a context token cannot fit
# file id, owner, most bytes -> its name, and its content (None: it has more than that many bytes)
Reader = Callable[[str, str, int], Awaitable[tuple[str, "bytes | None"]]]


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


class Budget:
    """What one request's file parts may take, all together: MAX_BYTES of files (checked from the
    files' sizes before any is read) and as many characters of text as its model's context could
    hold; a file named twice is read once."""

    def __init__(self, context_tokens: int):
        self.bytes_left = MAX_BYTES
        self.chars_left = max(1, context_tokens) * CHARS_PER_TOKEN
        self.read: dict[str, tuple[str, bytes]] = {}   # file id -> its name and content

    def take(self, size: int, where: str) -> None:
        if size > self.bytes_left:
            raise _bad(where, f"{where} takes the files of this request over 50 MB in all, the most files given "
                              "as input may be. Add them to a vector store and use file_search instead.")
        self.bytes_left -= size


async def part_text(part: dict[str, Any], where: str, owner: str, reader: Reader | None, budget: Budget) -> str:
    """The text the model reads for the file of ``part`` (at ``where``): its name and its text."""
    name, data = await _content(part, where, owner, reader, budget)
    try:
        text = await anyio.to_thread.run_sync(extract, data, name)
    except (Unsupported, Invalid) as e:
        raise _bad(where, f"{where}: {e}") from None
    if len(text) > budget.chars_left:
        raise InvalidRequestError(f"{where}: the text of the files of this request is longer than the model's "
                                  "context could hold; send fewer or shorter files, or add them to a vector store "
                                  "and use file_search.", param=where, code="context_length_exceeded")
    budget.chars_left -= len(text)
    return f"File {name}:\n{text}"


async def _content(part: dict[str, Any], where: str, owner: str, reader: Reader | None,
                   budget: Budget) -> tuple[str, bytes]:
    if part.get("file_url") is not None:
        raise _bad(f"{where}.file_url", f"{where} has a file_url; this server fetches nothing. Upload the file "
                                        "(POST /v1/files) and send its file_id, or send its file_data.")
    file_id, data = part.get("file_id"), part.get("file_data")
    if isinstance(file_id, str):
        if reader is None:
            raise _bad(f"{where}.file_id", "This server keeps no files; send the file's file_data.")
        if file_id in budget.read:   # (named twice: read once, and counted once)
            return budget.read[file_id]
        try:
            name, found = await reader(file_id, owner, budget.bytes_left)
        except NotFoundError:
            raise NotFoundError(f"File with id '{file_id}' not found.", param=f"{where}.file_id") from None
        if found is None:   # (over what is left: not read)
            budget.take(budget.bytes_left + 1, where)
        assert found is not None
        budget.take(len(found), where)
        budget.read[file_id] = (name, found)
        return name, found
    if not isinstance(data, str):
        raise _bad(where, f"{where} is a file part and needs a file_id or its file_data.")
    filename = part.get("filename")
    if not isinstance(filename, str) or not filename:
        raise _bad(f"{where}.filename", f"{where} has file_data and needs its filename (the name tells how to read "
                                        "it: report.pdf, notes.md).")
    try:
        content = base64.b64decode(data.split(",", 1)[1] if data.startswith("data:") else data, validate=True)
    except (binascii.Error, ValueError, IndexError):
        raise _bad(f"{where}.file_data", f"{where}.file_data must be the file, base64-encoded (or a data URL of "
                                         "it).") from None
    budget.take(len(content), where)
    return filename, content
