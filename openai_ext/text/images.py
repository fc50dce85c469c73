"""Image parts of chat messages, for a vision model: loaded in the web UI, or served standalone
with its projector (hosts/llamacpp/vision.py).

The web UI's own API puts one ``<__media__>`` placeholder per image at the start of the
message's text (``process_multimodal_content``) and hands the images to its loader as PIL
images in ``state['raw_images']``, in the order the placeholders come; its llama.cpp loader
swaps each placeholder for llama-server's media marker. This server does the same. It fetches
no URL (no request may make it reach another host), so an image must come as a data URL.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from ..core.errors import PARAM, InvalidRequestError

MEDIA = "<__media__>"
# An image this large (decoded) is refused before it is decoded: a vision model sees a few
# hundred tokens of it whatever its size.
MAX_IMAGE_BYTES = 20 * 1024 * 1024

# how to send an image, in messages a family may word its own way (the "image_form" phrase)
IMAGE_FORM = {"image_form": "a data URL (data:image/png;base64,...)"}
# what to do about an image sent to a model without vision: in the web UI, and standalone
ADVICE = {True: "Load a vision model in the web UI (a llama.cpp model with its --mmproj file, or an ExLlamaV3 "
                "vision model), or send text only.",
          False: "This model reads text only: serve a vision model with its projector (--mmproj, or a hub repo "
                 "that has an mmproj file), or send text only."}


def no_vision(where: str, web_ui: bool, *, what: str = "is an image", param: str | None = None) -> InvalidRequestError:
    """The 400 for an image sent to a model without vision, naming the part."""
    return InvalidRequestError(f"{{part}} {what}, and the loaded model has no vision. {ADVICE[web_ui]}",
                               param=param or f"{where}.type", paths={"part": where})


def decode(url: Any, where: str) -> Any:
    """A data URL as a PIL image (RGB, as the web UI converts its attachments)."""
    if not isinstance(url, str) or not url:
        raise InvalidRequestError(f"{PARAM} has no image URL; send the image as {{image_form}}.", param=where,
                                  words=IMAGE_FORM)
    if url.startswith(("http://", "https://")):
        raise InvalidRequestError(f"{PARAM} is an http URL; this server fetches no URL. Send the image itself as "
                                  "{image_form}.", param=where, words=IMAGE_FORM)
    head, _, data = url.partition(",")
    if not (head.startswith("data:image/") and head.endswith(";base64")) or not data:
        raise InvalidRequestError(f"{PARAM} is not a base64 data URL of an image; send data:image/png;base64,... "
                                  "(or jpeg, webp, gif).", param=where)
    if len(data) * 3 // 4 > MAX_IMAGE_BYTES:
        raise InvalidRequestError(f"{PARAM} holds more than {MAX_IMAGE_BYTES // (1024 * 1024)} MB; send a smaller "
                                  "image.", param=where)
    try:
        raw = base64.b64decode(data, validate=True)
        from PIL import Image

        image = Image.open(io.BytesIO(raw))
        image.load()
    except (binascii.Error, ValueError, OSError) as e:
        raise InvalidRequestError(f"{PARAM} could not be read as an image ({type(e).__name__}); send a PNG, JPEG, "
                                  "WebP or GIF as {image_form}.", param=where, words=IMAGE_FORM) from None
    return image.convert("RGB") if image.mode != "RGB" else image


def with_placeholders(texts: list[str], images: int) -> str:
    """A message's text as the web UI's API writes it: the placeholders first, then the text."""
    text = "\n".join(texts)
    return f"{MEDIA * images}\n\n{text}" if images else text
