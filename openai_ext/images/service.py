"""/v1/images/*: OpenAI's image API over a Stable Diffusion web UI (see sd_client.py).

generations -> txt2img. edits -> img2img, inpainting where the mask is transparent.
variations -> img2img with no prompt. The web UI's address is the sd_webui_url setting (or the
SD_WEBUI_URL environment variable).
"""

from __future__ import annotations

import re
import time
from typing import Any, Literal

import anyio
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from ..core.config import Settings
from ..core.errors import InvalidRequestError, refuse_unknown_fields
from ..core.multipart import Form, JsonForm, form_schema, read_form
from .sd_client import SdClient
from .uploads import default_size, prepare_images

STEPS = {"low": 12, "standard": 25, "medium": 25, "auto": 25, "hd": 40, "high": 40}
CFG = {"vivid": 7.5, "natural": 5.0}
_SIZE = re.compile(r"^(\d{2,4})x(\d{2,4})$")
# GPT image models always answer base64; the others default to a URL (here a data URL).
BASE64_ONLY_PREFIXES = ("gpt-image", "chatgpt-image")


class ImageGenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")   # kept to be named in the 400 (refuse_unknown_fields)

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


def parse_size(size: str | None, default: tuple[int, int] | None) -> tuple[int, int] | None:
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


def _sd_settings(quality: str | None, style: str | None) -> dict[str, Any]:
    return {"steps": STEPS[quality or "auto"], "cfg_scale": CFG[style or "vivid"]}


def default_response_format(model: str | None) -> str:
    return "b64_json" if model and model.startswith(BASE64_ONLY_PREFIXES) else "url"


def _check_common(output_format: str | None, stream: bool | None, background: str | None) -> None:
    if output_format not in (None, "png"):
        raise InvalidRequestError("The Stable Diffusion web UI returns PNG images; use output_format 'png'.",
                                  param="output_format")
    if stream:
        raise InvalidRequestError("Streaming partial images is not supported; set stream to false.", param="stream")
    if background == "transparent":
        raise InvalidRequestError("Transparent backgrounds are not supported; use 'opaque' or 'auto'.",
                                  param="background")


def openapi(need_prompt: bool) -> dict[str, Any]:
    """The multipart body of edits and variations, for the app's OpenAPI schema."""
    fields: dict[str, Any] = {
        "image": {"type": "string", "format": "binary"},
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "size": {"type": "string"},
        "response_format": {"type": "string", "enum": ["url", "b64_json"]},
        "model": {"type": "string"},
    }
    if need_prompt:
        fields.update({"prompt": {"type": "string"}, "mask": {"type": "string", "format": "binary"}})
    schema = form_schema(fields, ["image", "prompt"] if need_prompt else ["image"])
    if need_prompt:   # OpenAI's JSON form of edits: the images as data URLs
        ref = {"type": "object", "properties": {"image_url": {"type": "string"}, "file_id": {"type": "string"}}}
        schema["requestBody"]["content"]["application/json"] = {"schema": {
            "type": "object", "required": ["images", "prompt"], "properties": {
                "images": {"type": "array", "minItems": 1, "maxItems": 16, "items": ref}, "mask": ref,
                "prompt": {"type": "string"}, "n": fields["n"], "size": fields["size"], "model": fields["model"],
                "response_format": fields["response_format"]}}}
    return schema


class ImagesService:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.sd = SdClient(settings)
        self._decoding: anyio.CapacityLimiter | None = None

    @property
    def decoding(self) -> anyio.CapacityLimiter:
        """One upload decoded at a time: a few large images at once would take gigabytes."""
        if self._decoding is None:
            self._decoding = anyio.CapacityLimiter(1)
        return self._decoding

    async def _answer(self, endpoint: str, payload: dict[str, Any], n: int, response_format: str | None,
                      model: str | None) -> dict[str, Any]:
        images = (await self.sd.images(endpoint, payload, model))[:n]
        as_url = (response_format or default_response_format(model)) == "url"
        data = [{"url": f"data:image/png;base64,{img}"} if as_url else {"b64_json": img} for img in images]
        return {"created": int(time.time()), "data": data}

    async def generations(self, body: ImageGenerationRequest) -> dict[str, Any]:
        refuse_unknown_fields(body, self.settings.allow_unknown_fields)
        _check_common(body.output_format, body.stream, body.background)
        width, height = parse_size(body.size, (512, 512))
        n = body.n or 1
        payload = {"prompt": body.prompt, "negative_prompt": "", "width": width, "height": height,
                   "batch_size": n, "n_iter": 1, "seed": -1, **_sd_settings(body.quality, body.style)}
        return await self._answer("txt2img", payload, n, body.response_format, body.model)

    async def img2img(self, request: Request, *, need_prompt: bool) -> dict[str, Any]:
        # the uploads' spooled files are closed as soon as the form is read, whatever happens
        # edits also take OpenAI's JSON form (images as data URLs); variations are multipart only
        json_files = {"image": "images", "mask": "mask"} if need_prompt else None
        async with read_form(request, hint="the picture in an 'image' field", json_files=json_files) as form:
            payload, n, response_format, model = await self._read_img2img(form, need_prompt=need_prompt)
        return await self._answer("img2img", payload, n, response_format, model)

    async def _read_img2img(self, form: Form | JsonForm, *, need_prompt: bool
                            ) -> tuple[dict[str, Any], int, str | None, str | None]:
        prompt = form.text("prompt")
        if need_prompt and (prompt is None or not prompt.strip()):
            raise InvalidRequestError("Missing required parameter: 'prompt'.", param="prompt")
        n = form.integer("n", 1, 10, 1)
        response_format = form.choice("response_format", ("url", "b64_json"))
        _check_common(form.choice("output_format", ("png", "jpeg", "webp")),
                      (form.text("stream") or "").lower() in ("true", "1"),
                      form.choice("background", ("transparent", "opaque", "auto")))
        size = parse_size(form.text("size") or None, None)   # None: from the image, see default_size
        quality = form.choice("quality", tuple(STEPS))
        model = form.text("model")
        image = await form.file("image", required=True, example="picture.png")
        mask = await form.file("mask", required=False, example="mask.png")
        init, image_size, sd_mask = await anyio.to_thread.run_sync(prepare_images, image, mask,
                                                                   limiter=self.decoding)
        width, height = size or default_size(*image_size)
        payload: dict[str, Any] = {
            "prompt": prompt or "", "negative_prompt": "", "init_images": [init],
            "width": width, "height": height, "batch_size": n, "n_iter": 1, "seed": -1,
            "denoising_strength": 0.75 if need_prompt else 0.6, **_sd_settings(quality, None)}
        if sd_mask is not None:
            payload.update(mask=sd_mask, inpainting_fill=1, inpaint_full_res=False)
        return payload, n, response_format, model
