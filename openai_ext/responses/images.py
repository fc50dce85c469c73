"""``input_image`` parts of Responses input items.

An image part is read as chat reads an image part (text/images.py: a data URL, no URL fetched)
and kept in OpenAI's listed shape (``{"type": "input_image", "image_url", "file_id", "detail"}``),
so that a response continued with ``previous_response_id`` (or a conversation) still shows it to
the model: convert.py hands it to chat as an ``image_url`` part, and chat's code puts it in the
web UI's ``raw_images``. What is stored stays bounded: an image whose data URL is longer than
``STORED_CHARS`` is scaled down (to ``SIDES[0]`` pixels on its longer side, and further while
still too long) and kept as a JPEG, and the model sees that same image on the first turn too.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from ..core.errors import InvalidRequestError
from ..text import images as chat_images
from .item_types import ContentPart, InputImagePart, Item

DETAILS = ("auto", "low", "high", "original")
STORED_CHARS = 1_500_000   # about 1.1 MB of image
SIDES = (1568, 1024, 768, 512)


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def part(raw: dict[str, Any], where: str, *, vision: bool | None, web_ui: bool) -> InputImagePart:
    """An input_image part in its stored shape. ``vision``: whether the loaded model reads images
    (None: items stored for later, as a conversation's, are not shown to a model now)."""
    if vision is False:
        raise chat_images.no_vision(where, web_ui)
    url, file_id, detail = raw.get("image_url"), raw.get("file_id"), raw.get("detail")
    if url is None and file_id is not None:
        raise _bad(f"{where}.file_id", f"{where} names a file_id; images are not read from the Files API here. Send "
                                       "the image itself as image_url, a data URL (data:image/png;base64,...).")
    if not isinstance(url, str):
        raise _bad(f"{where}.image_url", f"{where}.image_url must be the image as a data URL "
                                         "(data:image/png;base64,...).")
    if detail is not None and detail not in DETAILS:
        raise _bad(f"{where}.detail", f"{where}.detail must be one of {', '.join(DETAILS)}.")
    image = chat_images.decode(url, f"{where}.image_url")
    if len(url) > STORED_CHARS:
        url = _bounded(image)
    return {"type": "input_image", "image_url": url, "file_id": None, "detail": detail or "auto"}


def _bounded(image: Any) -> str:
    """The image as a JPEG data URL no longer than STORED_CHARS, scaled down as far as it must be."""
    for side in SIDES:
        small = image.copy()
        small.thumbnail((side, side))
        buffered = io.BytesIO()
        small.save(buffered, format="JPEG", quality=85)
        url = "data:image/jpeg;base64," + base64.b64encode(buffered.getvalue()).decode()
        if len(url) <= STORED_CHARS:
            break
    return url


def held(item: Item) -> bool:
    """Whether a stored item shows the model an image."""
    content = item["content"] if item["type"] == "message" else \
        item["output"] if item["type"] == "function_call_output" else None
    return isinstance(content, list) and any(p.get("type") == "input_image" for p in content)


def _text(p: ContentPart) -> str:
    return str(p.get("text", p.get("refusal", "")))


def chat_content(content: str | list[ContentPart] | None) -> str | list[dict[str, Any]]:
    """An item's content as chat's: its text, or, where it holds images, chat's parts."""
    if isinstance(content, str):
        return content
    parts = content or []
    if not any(p.get("type") == "input_image" for p in parts):
        return "\n".join(_text(p) for p in parts)
    return [{"type": "image_url", "image_url": {"url": p["image_url"]}} if p["type"] == "input_image"
            else {"type": "text", "text": _text(p)} for p in parts]
