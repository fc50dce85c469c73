"""Uploaded images for edits and variations: decoded safely (PNG, JPEG and WebP only, a pixel cap
checked from the header before the pixels are decoded) and re-encoded for the web UI."""

from __future__ import annotations

import base64
import io

from ..core.errors import InvalidRequestError

# The web UI's bounds on width and height (the same rule parse_size applies to `size`).
SIDE_MIN, SIDE_MAX = 64, 2048
# Uploads may have at most this many pixels. It is checked from the image header, before the pixel
# data is decoded, so a small file that declares a huge image (a decompression bomb) costs nothing.
MAX_UPLOAD_SIDE = 4096
MAX_UPLOAD_PIXELS = MAX_UPLOAD_SIDE * MAX_UPLOAD_SIDE
# What OpenAI accepts for edits and variations. Other decoders of PIL are not offered to untrusted
# uploads (EPS, for one, runs Ghostscript).
UPLOAD_FORMATS = ("PNG", "JPEG", "WEBP")


def default_size(width: int, height: int) -> tuple[int, int]:
    """The output size when the request gives no `size` (or 'auto'): the upload's own size, brought
    within the web UI's bounds.

    OpenAI takes any square PNG under 4 MB and answers at the size asked for, so a client that leaves
    `size` out expects an image back, not an error about the size of its upload. So rather than refuse,
    this keeps the upload's aspect ratio and scales it down until both sides are at most 2048 (or up
    until the shorter side is 64), then rounds each side to a multiple of 8. Only an aspect ratio past
    32:1 cannot keep its shape; its shorter side is then widened to 64.
    """
    scale = min(1.0, SIDE_MAX / max(width, height))
    if min(width, height) * scale < SIDE_MIN:
        scale = min(SIDE_MIN / min(width, height), SIDE_MAX / max(width, height))
    w, h = (min(SIDE_MAX, max(SIDE_MIN, round(side * scale / 8) * 8)) for side in (width, height))
    return w, h


def _too_big(param: str, name: str, size: tuple[int, int] | None) -> InvalidRequestError:
    what = f"is {size[0]}x{size[1]} pixels" if size else "declares far too many pixels"
    return InvalidRequestError(
        f"{param}{name} {what}; uploaded images may have at most {MAX_UPLOAD_PIXELS:,} pixels "
        f"({MAX_UPLOAD_PIXELS / 1e6:.1f} megapixels, e.g. {MAX_UPLOAD_SIDE}x{MAX_UPLOAD_SIDE}). "
        f"Scale the image down and upload it again.", param=param)


def _open_image(data: bytes, filename: str | None, param: str):
    """Decodes an upload (blocking: call it on a worker thread)."""
    from PIL import Image, UnidentifiedImageError

    name = f" ({filename})" if filename else ""
    if not data:
        raise InvalidRequestError(f"{param}{name} is empty; upload a PNG image.", param=param)
    try:
        image = Image.open(io.BytesIO(data), formats=UPLOAD_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # PIL's own guard (2x its MAX_IMAGE_PIXELS, or 1x where warnings are errors) is far above ours
        raise _too_big(param, name, None) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        raise InvalidRequestError(f"{param}{name} is not a PNG, JPEG or WebP image; upload a PNG.",
                                  param=param) from None
    if image.size[0] * image.size[1] > MAX_UPLOAD_PIXELS:
        raise _too_big(param, name, image.size)
    try:
        image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_big(param, name, None) from None
    except Exception as e:  # noqa: BLE001 - any failure to decode untrusted bytes is the upload's fault
        raise InvalidRequestError(f"{param}{name} could not be decoded ({type(e).__name__}): the file is "
                                  "damaged or truncated; upload a valid PNG.", param=param) from None
    return image


def _b64_png(image) -> str:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def _inpaint_mask(mask) -> str:
    """OpenAI marks the area to edit as transparent; the web UI wants it white on black."""
    if "transparency" in mask.info or ("A" in mask.getbands() and mask.mode != "RGBA"):
        mask = mask.convert("RGBA")   # palette or grey PNGs with transparency, LA, PA
    if "A" not in mask.getbands():
        raise InvalidRequestError("mask must be a PNG with transparency: transparent pixels mark what to edit.",
                                  param="mask")
    alpha = mask.getchannel("A")
    return _b64_png(alpha.point(lambda a: 255 if a == 0 else 0).convert("L"))


def prepare_images(image: tuple[str | None, bytes], mask: tuple[str | None, bytes] | None
                    ) -> tuple[str, tuple[int, int], str | None]:
    """Decodes the uploads and re-encodes them for the web UI: (init image as base64 PNG, the image's
    size, inpainting mask as base64 PNG or None). CPU-bound and blocking: it runs on a worker thread."""
    decoded = _open_image(image[1], image[0], "image")
    try:
        init = _b64_png(decoded.convert("RGB"))
    except (OSError, ValueError) as e:
        raise InvalidRequestError(f"image ({decoded.mode} pixels) could not be converted to RGB "
                                  f"({type(e).__name__}); upload an RGB or RGBA PNG.", param="image") from None
    if mask is None:
        return init, decoded.size, None
    mask_image = _open_image(mask[1], mask[0], "mask")
    if mask_image.size != decoded.size:
        raise InvalidRequestError(f"mask is {mask_image.size[0]}x{mask_image.size[1]} but image is "
                                  f"{decoded.size[0]}x{decoded.size[1]}; mask must have the same size as image.",
                                  param="mask")
    try:
        return init, decoded.size, _inpaint_mask(mask_image)
    except (OSError, ValueError) as e:
        raise InvalidRequestError(f"mask ({mask_image.mode} pixels) could not be read ({type(e).__name__}); "
                                  "upload an RGBA PNG.", param="mask") from None
