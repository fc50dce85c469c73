"""Chat's ``file`` content parts (``{"type": "file", "file": {"file_id" | "file_data", "filename"}}``):
each file is read as text (files/parts.py: an uploaded file of the caller's, or one sent inline)
before the request is admitted, and the part becomes a text part holding the file's name and text,
which the model reads as one more paragraph of its message."""

from __future__ import annotations

from typing import Any

from ..core.errors import InvalidRequestError
from ..documents.inputs import Budget, Reader, part_text
from .protocol import ChatCompletionRequest, TextPart


async def inline(body: ChatCompletionRequest, owner: str, reader: Reader | None, context_tokens: int) -> None:
    """Turns ``body``'s file parts into text parts (a 400 or 404 naming the part), within one
    budget for the request (documents/inputs.py)."""
    budget = Budget(context_tokens)
    for i, message in enumerate(body.messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            if part.type != "file":
                continue
            where = f"messages[{i}].content[{j}].file"
            given: Any = (part.model_extra or {}).get("file")
            if not isinstance(given, dict):
                raise InvalidRequestError(f"{where} is missing: a file part holds {{file_id}}, or {{file_data, "
                                          "filename}.", param=where)
            message.content[j] = TextPart(type="text", text=await part_text(given, where, owner, reader, budget))
