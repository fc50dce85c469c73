"""/v1/images/*: OpenAI's image API over the web UI's own image model or a Stable Diffusion web UI.

generations: in extension mode, with an image model loaded in the web UI's Image tab, that model
draws them (hosts/textgen/images.py), as the web UI's own API does; otherwise a Stable Diffusion
web UI's txt2img (sd_client.py). edits -> img2img, inpainting where the mask is transparent.
variations -> img2img with no prompt (the Stable Diffusion web UI only). Its address is the
sd_webui_url setting (or the SD_WEBUI_URL environment variable).
"""

from __future__ import annotations

import base64
import io
import re
import time
from typing import Any, Callable, Literal, overload

import anyio
from fastapi import Request
from pydantic import Field

from ..core.api_model import ApiModel
from ..core.config import Settings
from ..core.errors import InvalidRequestError, ServerError, ServiceUnavailableError
from ..core.multipart import Form, JsonForm, form_schema, read_form
from ..hosts.base import Host
from .sd_client import SdClient
from .uploads import default_size, prepare_images

STEPS = {"low": 12, "standard": 25, "medium": 25, "auto": 25, "hd": 40, "high": 40}
CFG = {"vivid": 7.5, "natural": 5.0}
_SIZE = re.compile(r"^(\d{2,4})x(\d{2,4})$")
# GPT image models always answer base64; the others default to a URL (here a data URL).
BASE64_ONLY_PREFIXES = ("gpt-image", "chatgpt-image")
# The web UI's image models (Z-Image, Qwen-Image ...) take sizes in steps of 16, as its Image tab.
WEB_UI_STEP = 16


class ImageGenerationRequest(ApiModel):

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


@overload
def parse_size(size: str | None, default: tuple[int, int], step: int = 8) -> tuple[int, int]: ...


@overload
def parse_size(size: str | None, default: None, step: int = 8) -> tuple[int, int] | None: ...


def parse_size(size: str | None, default: tuple[int, int] | None, step: int = 8) -> tuple[int, int] | None:
    if size in (None, "auto"):
        return default
    m = _SIZE.match(size)
    if not m:
        raise InvalidRequestError(f"size {size!r} must look like 512x512 (width x height), or be 'auto'.", param="size")
    w, h = int(m.group(1)), int(m.group(2))
    if not (64 <= w <= 2048 and 64 <= h <= 2048) or w % step or h % step:
        raise InvalidRequestError(f"size {size!r}: width and height must be multiples of {step} from 64 to 2048.",
                                  param="size")
    return w, h


def _sd_settings(quality: str | None, style: str | None) -> dict[str, Any]:
    return {"steps": STEPS[quality or "auto"], "cfg_scale": CFG[style or "vivid"]}


def default_response_format(model: str | None) -> str:
    return "b64_json" if model and model.startswith(BASE64_ONLY_PREFIXES) else "url"


def _check_common(output_format: str | None, stream: bool | None, background: str | None) -> None:
    if output_format not in (None, "png"):
        raise InvalidRequestError("Images are returned as PNG; use output_format 'png'.",
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


def _png(image: Any) -> str:
    buffered = io.BytesIO()
    image.save(buffered, format="PNG")
    return base64.b64encode(buffered.getvalue()).decode()


class ImagesService:
    def __init__(self, settings: Settings, host: Callable[[], Host | None] | None = None):
        self.settings = settings
        self.sd = SdClient(settings)
        self.host = host or (lambda: None)   # the text host that serves now (its image model, if any)
        self._decoding: anyio.CapacityLimiter | None = None

    @property
    def decoding(self) -> anyio.CapacityLimiter:
        """One upload decoded at a time: a few large images at once would take gigabytes."""
        if self._decoding is None:
            self._decoding = anyio.CapacityLimiter(1)
        return self._decoding

    async def _answer(self, endpoint: str, payload: dict[str, Any], n: int, response_format: str | None,
                      model: str | None) -> dict[str, Any]:
        return _reply((await self.sd.images(endpoint, payload, model))[:n], response_format, model)

    async def generations(self, body: ImageGenerationRequest) -> dict[str, Any]:
        _check_common(body.output_format, body.stream, body.background)
        host = self.host()
        web_ui = host.image_model() if host is not None else None
        if web_ui is not None:
            return await self._web_ui(web_ui, body)
        if not self.settings.sd_webui_url and host is not None and host.abilities.web_ui:
            raise ServiceUnavailableError(
                "No image model: load one in the web UI's Image tab (its Model section), or start a Stable Diffusion "
                "web UI with its API enabled (--api) and set sd_webui_url (or the SD_WEBUI_URL environment "
                "variable) to its address.", code="images_not_configured", retry=False)
        width, height = parse_size(body.size, (512, 512))
        n = body.n or 1
        payload = {"prompt": body.prompt, "negative_prompt": "", "width": width, "height": height,
                   "batch_size": n, "n_iter": 1, "seed": -1, **_sd_settings(body.quality, body.style)}
        return await self._answer("txt2img", payload, n, body.response_format, body.model)

    async def _web_ui(self, model: Any, body: ImageGenerationRequest) -> dict[str, Any]:
        """Drawn by the image model loaded in the web UI. quality and style are not applied: its
        steps and CFG scale are the Image tab's, set there for that model."""
        width, height = parse_size(body.size, model.default_size(), step=WEB_UI_STEP)
        n = body.n or 1
        images = await anyio.to_thread.run_sync(model.generate, body.prompt, width, height, n)
        if not images:
            raise ServerError(f"The web UI's image model ({model.name}) produced no images: its generation failed "
                              "or was stopped. The web UI's console says why; retry, or ask for fewer or smaller "
                              "images.", code="image_generation_failed")
        return _reply([_png(image) for image in images[:n]], body.response_format, body.model)

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
        assert image is not None, "a required file is there or file() raised"
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


def _reply(images: list[str], response_format: str | None, model: str | None) -> dict[str, Any]:
    """OpenAI's ImagesResponse for base64 PNGs: data URLs, or b64_json."""
    as_url = (response_format or default_response_format(model)) == "url"
    data = [{"url": f"data:image/png;base64,{img}"} if as_url else {"b64_json": img} for img in images]
    return {"created": int(time.time()), "data": data}
