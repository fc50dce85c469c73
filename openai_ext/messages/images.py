"""Image blocks of Messages requests, as chat's image parts.

A base64 source becomes a data URL in an ``image_url`` part, so the image reaches a vision model
loaded in the web UI through chat's own code (text/images.py: placeholders in the prompt, PIL
images in the state's ``raw_images``). A url source is passed on for chat to refuse as it refuses
http URLs: the server fetches nothing. Chat names a part by its place in the chat request;
``block_names`` puts back the block it came from (``messages[i].content[j]``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..core.errors import InvalidRequestError

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")

# A chat part, and where its block was sent (with its source's field) when it is an image.
Part = tuple[dict[str, Any], "tuple[str, str] | None"]


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def image(block: Any, where: str) -> Part:
    """An image block as chat's image_url part: a base64 source as a data URL; a url source is
    passed on for chat to refuse as it refuses http URLs (the server fetches nothing)."""
    src = (block.model_extra or {}).get("source")
    if not isinstance(src, dict):
        raise _bad(f"{where} is an image block without a source; send source {{type: base64, media_type, data}}.",
                   f"{where}.source")
    kind, url = src.get("type"), src.get("url")
    if kind == "base64":
        media, data = src.get("media_type"), src.get("data")
        if media not in IMAGE_TYPES:
            raise _bad(f"{where}.source.media_type must be one of {', '.join(IMAGE_TYPES)}.",
                       f"{where}.source.media_type")
        if not isinstance(data, str) or not data:
            raise _bad(f"{where}.source.data must be the image, base64-encoded.", f"{where}.source.data")
        url, source_field = f"data:{media};base64,{data}", "data"
    elif kind == "url":
        source_field = "url"
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise _bad(f"{where}.source.url must be an http or https URL.", f"{where}.source.url")
    elif kind == "file":
        raise _bad(f"{where}.source is a file source (Anthropic's Files API), which this server does not read. Send "
                   "the image as a base64 source.", f"{where}.source.type")
    else:
        raise _bad(f"{where}.source.type must be base64 (or url, or file); got {kind!r}.", f"{where}.source.type")
    return {"type": "image_url", "image_url": {"url": url}}, (where, source_field)


def parts_content(parts: list[Part], names: dict[str, tuple[str, str]], k: int) -> Any:
    """Chat message k's content: its text, or its parts where it holds images (named in ``names``)."""
    if all(origin is None for _, origin in parts):
        return "\n".join(p["text"] for p, _ in parts)
    for n, (_, origin) in enumerate(parts):
        if origin is not None:
            names[f"messages[{k}].content[{n}]"] = origin
    return [p for p, _ in parts]


CHAT_PART = re.compile(r"(messages\[\d+\]\.content\[\d+\])(\.image_url\.url)?(?=[.\[]|$)")
# how to send an image, as Anthropic's requests do (text/images.py's image_form phrase)
WORDS = {"image_form": "a base64 source"}


def block_names(names: dict[str, tuple[str, str]]) -> Callable[[str], str]:
    """Chat's path of an image part (``messages[k].content[n]``, its ``.image_url.url``), as the
    path of the Messages block it came from (``names``), its url as the source's field."""
    def name(path: str) -> str:
        m = CHAT_PART.match(path)
        if m is None or m.group(1) not in names:
            return path
        where, source_field = names[m.group(1)]
        return where + (f".source.{source_field}" if m.group(2) else "") + path[m.end():]
    return name
