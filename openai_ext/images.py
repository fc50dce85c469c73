"""/v1/images/*: a proxy to a Stable Diffusion web UI's API (AUTOMATIC1111-style /sdapi/v1).

generations -> txt2img. edits -> img2img, inpainting where the mask is transparent.
variations -> img2img with no prompt. The web UI's address is the sd_webui_url setting (or the
SD_WEBUI_URL environment variable). Calls run on a worker thread with a timeout, so a slow or
dead web UI gives a 504 or 502, never a hang.
"""

from __future__ import annotations

import base64
import io
import re
import time
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Request, UploadFile
from pydantic import BaseModel, Field

from .errors import InvalidRequestError, OpenAIError, ServiceUnavailableError, UpstreamError

router = APIRouter(prefix="/images")

# OpenAI's model names mean "whatever checkpoint the web UI has loaded"; any other name picks a
# checkpoint of the web UI by its title.
OPENAI_IMAGE_MODELS = {"dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini", "gpt-image-1.5", "gpt-image-2",
                       "chatgpt-image-latest"}
STEPS = {"low": 12, "standard": 25, "medium": 25, "auto": 25, "hd": 40, "high": 40}
CFG = {"vivid": 7.5, "natural": 5.0}
_SIZE = re.compile(r"^(\d{2,4})x(\d{2,4})$")


class GatewayTimeout(OpenAIError):
    status = 504
    type = "server_error"


class ImageGenerationRequest(BaseModel):
    prompt: str = Field(min_length=1, max_length=32000)
    model: str | None = None
    n: int | None = Field(None, ge=1, le=10)
    quality: Literal["standard", "hd", "low", "medium", "high", "auto"] | None = None
    response_format: Literal["url", "b64_json"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    output_compression: int | None = Field(None, ge=0, le=100)
    size: str | None = None
    style: Literal["vivid", "natural"] | None = None
    background: Literal["transparent", "opaque", "auto"] | None = None
    moderation: Literal["low", "auto"] | None = None
    stream: bool | None = None
    partial_images: int | None = None
    user: str | None = None


def parse_size(size: str | None, default: tuple[int, int]) -> tuple[int, int]:
    if size in (None, "auto"):
        return default
    m = _SIZE.match(size)
    if not m:
        raise InvalidRequestError(f"size {size!r} must look like 512x512 (width x height), or be 'auto'.", param="size")
    w, h = int(m.group(1)), int(m.group(2))
    if not (64 <= w <= 2048 and 64 <= h <= 2048) or w % 8 or h % 8:
        raise InvalidRequestError(f"size {size!r}: width and height must be multiples of 8 from 64 to 2048.",
                                  param="size")
    return w, h


def _sd_settings(model: str | None, quality: str | None, style: str | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"steps": STEPS[quality or "auto"], "cfg_scale": CFG[style or "vivid"]}
    if model and model not in OPENAI_IMAGE_MODELS:
        payload["override_settings"] = {"sd_model_checkpoint": model}
    return payload


def _check_common(output_format: str | None, stream: bool | None, background: str | None) -> None:
    if output_format not in (None, "png"):
        raise InvalidRequestError("The Stable Diffusion web UI returns PNG images; use output_format 'png'.",
                                  param="output_format")
    if stream:
        raise InvalidRequestError("Streaming partial images is not supported; set stream to false.", param="stream")
    if background == "transparent":
        raise InvalidRequestError("Transparent backgrounds are not supported; use 'opaque' or 'auto'.",
                                  param="background")


def _base_url(request: Request) -> tuple[str, float]:
    settings = request.app.state.api.settings
    if not settings.sd_webui_url:
        raise ServiceUnavailableError(
            "Image generation is off: start a Stable Diffusion web UI with its API enabled (--api) and set "
            "sd_webui_url (or the SD_WEBUI_URL environment variable) to its address, e.g. http://127.0.0.1:7860.",
            code="images_not_configured")
    return settings.sd_webui_url.rstrip("/"), settings.sd_timeout


def _call_sd(url: str, payload: dict[str, Any], timeout: float) -> list[str]:
    """POSTs to the web UI and returns its base64 PNG images (blocking; run on a worker thread)."""
    import requests

    try:
        r = requests.post(url, json=payload, timeout=(min(10.0, timeout), timeout))
    except requests.Timeout:
        raise GatewayTimeout(f"The Stable Diffusion web UI did not answer within {timeout:g} s (sd_timeout).",
                             code="upstream_timeout") from None
    except requests.RequestException as e:
        raise UpstreamError(f"The Stable Diffusion web UI at {url.split('/sdapi')[0]} is not reachable "
                            f"({type(e).__name__}). Is it running with --api? Check sd_webui_url.",
                            code="upstream_unreachable") from None
    if r.status_code != 200:
        detail = r.text[:300]
        raise UpstreamError(f"The Stable Diffusion web UI answered {r.status_code}: {detail}", code="upstream_error")
    try:
        images = r.json()["images"]
        assert isinstance(images, list) and all(isinstance(i, str) for i in images)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise UpstreamError("The Stable Diffusion web UI sent an answer without images.",
                            code="upstream_error") from None
    return images


async def _generate(request: Request, endpoint: str, payload: dict[str, Any], n: int,
                    response_format: str | None) -> dict[str, Any]:
    base, timeout = _base_url(request)
    images = await anyio.to_thread.run_sync(_call_sd, f"{base}/sdapi/v1/{endpoint}", payload, timeout)
    images = [i.split(",", 1)[1] if i.startswith("data:") else i for i in images][:n]
    as_url = (response_format or "url") == "url"
    data = [{"url": f"data:image/png;base64,{img}"} if as_url else {"b64_json": img} for img in images]
    return {"created": int(time.time()), "data": data}


@router.post("/generations")
async def generations(body: ImageGenerationRequest, request: Request):
    _check_common(body.output_format, body.stream, body.background)
    width, height = parse_size(body.size, (512, 512))
    n = body.n or 1
    payload = {"prompt": body.prompt, "negative_prompt": "", "width": width, "height": height,
               "batch_size": n, "n_iter": 1, "seed": -1, **_sd_settings(body.model, body.quality, body.style)}
    return await _generate(request, "txt2img", payload, n, body.response_format)


# --- edits and variations: multipart uploads ---------------------------------------------------

def _png(upload: UploadFile, data: bytes, param: str):
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise InvalidRequestError(f"{param} is empty; upload a PNG image.", param=param)
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError):
        raise InvalidRequestError(f"{param} ({upload.filename}) is not an image; upload a PNG.", param=param) from None
    return image


def _b64_png(image) -> str:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def _inpaint_mask(mask) -> str:
    """OpenAI marks the area to edit as transparent; the web UI wants it white on black."""
    if "A" not in mask.getbands():
        raise InvalidRequestError("mask must be a PNG with transparency: transparent pixels mark what to edit.",
                                  param="mask")
    alpha = mask.getchannel("A")
    return _b64_png(alpha.point(lambda a: 255 if a == 0 else 0).convert("L"))


def _form_int(form, name: str, low: int, high: int, default: int) -> int:
    raw = form.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{name} must be an integer.", param=name) from None
    if not low <= value <= high:
        raise InvalidRequestError(f"{name} must be from {low} to {high}.", param=name)
    return value


def _form_choice(form, name: str, choices: tuple[str, ...]) -> str | None:
    value = form.get(name)
    if value in (None, ""):
        return None
    if value not in choices:
        raise InvalidRequestError(f"{name} must be one of {', '.join(choices)}.", param=name)
    return value


async def _upload(form, name: str, required: bool) -> tuple[UploadFile, bytes] | None:
    items = form.getlist(name) or form.getlist(f"{name}[]")
    files = [i for i in items if hasattr(i, "read")]
    if not files:
        if required:
            raise InvalidRequestError(f"Missing required file '{name}'; send it as multipart/form-data.", param=name)
        return None
    return files[0], await files[0].read()


async def _img2img(request: Request, *, need_prompt: bool) -> dict[str, Any]:
    form = await request.form()
    prompt = form.get("prompt")
    if need_prompt and (not isinstance(prompt, str) or not prompt.strip()):
        raise InvalidRequestError("Missing required parameter: 'prompt'.", param="prompt")
    upload, data = await _upload(form, "image", required=True)
    image = _png(upload, data, "image")
    n = _form_int(form, "n", 1, 10, 1)
    response_format = _form_choice(form, "response_format", ("url", "b64_json"))
    _check_common(_form_choice(form, "output_format", ("png", "jpeg", "webp")), form.get("stream") == "true",
                  _form_choice(form, "background", ("transparent", "opaque", "auto")))
    width, height = parse_size(form.get("size") or None, image.size)
    payload: dict[str, Any] = {
        "prompt": prompt or "", "negative_prompt": "", "init_images": [_b64_png(image.convert("RGB"))],
        "width": width, "height": height, "batch_size": n, "n_iter": 1, "seed": -1,
        "denoising_strength": 0.75 if need_prompt else 0.6,
        **_sd_settings(form.get("model"), _form_choice(form, "quality", tuple(STEPS)), None)}
    mask = await _upload(form, "mask", required=False)
    if mask is not None:
        mask_image = _png(mask[0], mask[1], "mask")
        if mask_image.size != image.size:
            raise InvalidRequestError("mask must have the same size as image.", param="mask")
        payload.update(mask=_inpaint_mask(mask_image), inpainting_fill=1, inpaint_full_res=False)
    return await _generate(request, "img2img", payload, n, response_format)


def _form_schema(need_prompt: bool) -> dict[str, Any]:
    """The multipart body in the app's OpenAPI schema (the route reads the form itself)."""
    fields: dict[str, Any] = {
        "image": {"type": "string", "format": "binary"},
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "size": {"type": "string"},
        "response_format": {"type": "string", "enum": ["url", "b64_json"]},
        "model": {"type": "string"},
    }
    if need_prompt:
        fields.update({"prompt": {"type": "string"}, "mask": {"type": "string", "format": "binary"}})
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["image", "prompt"] if need_prompt else ["image"], "properties": fields}}}}}


@router.post("/edits", openapi_extra=_form_schema(need_prompt=True))
async def edits(request: Request):
    return await _img2img(request, need_prompt=True)


@router.post("/variations", openapi_extra=_form_schema(need_prompt=False))
async def variations(request: Request):
    return await _img2img(request, need_prompt=False)
