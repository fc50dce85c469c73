"""/v1/images/*: a proxy to a Stable Diffusion web UI's API (AUTOMATIC1111-style /sdapi/v1).

generations -> txt2img. edits -> img2img, inpainting where the mask is transparent.
variations -> img2img with no prompt. The web UI's address is the sd_webui_url setting (or the
SD_WEBUI_URL environment variable). Calls run on a worker thread, one at a time, within an overall
deadline (sd_timeout), so a slow or dead web UI gives a 504 or 502, never a hang; a job abandoned at
the deadline is interrupted in the web UI.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import re
import threading
import time
from typing import Any, Callable, Literal

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from .errors import InvalidRequestError, OpenAIError, ServiceUnavailableError, UpstreamError, refuse_unknown_fields

log = logging.getLogger(__name__)
router = APIRouter(prefix="/images")

# OpenAI's model names mean "whatever checkpoint the web UI has loaded". Any other name picks one
# of the web UI's checkpoints (by its title, name, file name or hash) when /sdapi/v1/sd-models lists
# it, and is ignored otherwise: for a name it does not know, the web UI would load some other
# checkpoint in its place.
OPENAI_IMAGE_MODELS = {"dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini", "gpt-image-1.5", "gpt-image-2",
                       "chatgpt-image-latest"}
STEPS = {"low": 12, "standard": 25, "medium": 25, "auto": 25, "hd": 40, "high": 40}
CFG = {"vivid": 7.5, "natural": 5.0}
_SIZE = re.compile(r"^(\d{2,4})x(\d{2,4})$")
# GPT image models always answer base64; the others default to a URL (here a data URL).
BASE64_ONLY_PREFIXES = ("gpt-image", "chatgpt-image")

# The web UI renders one job at a time; more calls at once would only wait in its queue, holding
# threads of this server.
WEB_UI_CALLS = 1
CHECKPOINTS_TTL = 60.0               # seconds a /sd-models answer is reused
MAX_ANSWER_BYTES = 256 * 2 ** 20     # ten 2048x2048 PNGs in base64 fit well within this


class GatewayTimeout(OpenAIError):
    status = 504
    type = "server_error"


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


def without_credentials(text: str) -> str:
    """Every URL in the text without its user:password@: the web UI's credentials (sd_webui_url may
    carry them for its --api-auth) are not the client's business."""
    return re.sub(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@", r"\1", text)


def _base_url(request: Request) -> tuple[str, float]:
    settings = request.app.state.api.settings
    if not settings.sd_webui_url:
        raise ServiceUnavailableError(
            "Image generation is off: start a Stable Diffusion web UI with its API enabled (--api) and set "
            "sd_webui_url (or the SD_WEBUI_URL environment variable) to its address, e.g. http://127.0.0.1:7860.",
            code="images_not_configured", retry=False)
    return settings.sd_webui_url.rstrip("/"), settings.sd_timeout


def _too_slow(timeout: float) -> GatewayTimeout:
    return GatewayTimeout(f"The Stable Diffusion web UI did not finish within {timeout:g} s (sd_timeout); it may be "
                          "busy with earlier images. Retry later, ask for fewer or smaller images, or raise "
                          "sd_timeout.", code="upstream_timeout")


def _unreachable(base: str, exc: BaseException) -> UpstreamError:
    return UpstreamError(f"The Stable Diffusion web UI at {without_credentials(base)} is not reachable "
                         f"({type(exc).__name__}). Is it running with --api? Check sd_webui_url.",
                         code="upstream_unreachable")


def _read_body(response, deadline: float, timeout: float) -> bytes:
    """The whole answer, read piece by piece: requests' timeout bounds each read, not the total,
    so a web UI that sends slowly is cut off here at the deadline."""
    data = bytearray()
    for chunk in response.iter_content(1 << 16):
        data += chunk
        if time.monotonic() > deadline:
            raise _too_slow(timeout)
        if len(data) > MAX_ANSWER_BYTES:
            raise UpstreamError(f"The Stable Diffusion web UI sent more than {MAX_ANSWER_BYTES >> 20} MB; ask for "
                                "fewer or smaller images.", code="upstream_error")
    return bytes(data)


def _call_sd(base: str, endpoint: str, payload: dict[str, Any], deadline: float, timeout: float) -> list[str]:
    """POSTs to the web UI and returns its base64 PNG images (blocking; run on a worker thread)."""
    import requests

    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _too_slow(timeout)
    try:
        with requests.post(f"{base}/sdapi/v1/{endpoint}", json=payload, stream=True,
                           timeout=(min(10.0, remaining), remaining)) as r:
            body = _read_body(r, deadline, timeout)
            status = r.status_code
    except requests.Timeout:
        raise _too_slow(timeout) from None
    except requests.RequestException as e:
        raise _unreachable(base, e) from None
    if status != 200:
        detail = without_credentials(body.decode("utf-8", errors="replace")[:300])
        raise UpstreamError(f"The Stable Diffusion web UI answered {status}: {detail}", code="upstream_error")
    try:
        images = json.loads(body)["images"]
        assert isinstance(images, list) and all(isinstance(i, str) for i in images)
    except (ValueError, KeyError, TypeError, AssertionError):
        images = None
    if not images:
        raise UpstreamError("The Stable Diffusion web UI answered without images. A script or extension of the "
                            "web UI may have dropped them, or the job was interrupted there; see its console.",
                            code="upstream_error")
    return images


def _stop_abandoned_job(base: str, endpoint: str) -> None:
    """Best effort, on a thread of its own: asks the web UI to interrupt the job a timed-out request
    left behind, so that it does not go on rendering images nobody will receive. Only an API job of
    the same kind is stopped: a job started in the web UI's own page is someone else's."""
    import requests

    def interrupt() -> None:
        try:
            progress = requests.get(f"{base}/sdapi/v1/progress", params={"skip_current_image": "true"}, timeout=5)
            job = progress.json().get("state", {}).get("job")
            if job == f"scripts_{endpoint}":
                requests.post(f"{base}/sdapi/v1/interrupt", timeout=5)
        except (requests.RequestException, ValueError, AttributeError) as e:
            log.debug("Could not interrupt the abandoned job in the web UI: %s", type(e).__name__)

    threading.Thread(target=interrupt, name="sd-interrupt", daemon=True).start()


class _WebUiCall:
    """Runs one blocking call on a worker thread that holds a slot of the web UI's capacity limiter
    for as long as it really runs. The caller may stop waiting at the deadline; the thread then
    finishes on its own (its reads time out too) and gives the slot back when it ends."""

    def __init__(self, limiter) -> None:
        self.limiter = limiter
        self.started = False
        self._lock = threading.Lock()
        self._abandoned = False

    async def run(self, seconds: float, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        borrower = object()

        def give_back() -> None:
            try:
                loop.call_soon_threadsafe(self.limiter.release_on_behalf_of, borrower)
            except RuntimeError:   # the server's loop is gone: so is the limiter
                pass

        def work() -> Any:
            with self._lock:
                if self._abandoned:   # its caller gave up before it began; the slot is back already
                    return None
                self.started = True
            try:
                return fn(*args)
            finally:
                give_back()

        with anyio.fail_after(max(0.0, seconds)):
            await self.limiter.acquire_on_behalf_of(borrower)
            try:
                return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
            except BaseException:
                with self._lock:
                    if not self.started:
                        self._abandoned = True
                        self.limiter.release_on_behalf_of(borrower)
                raise


async def _checkpoint_titles(request: Request, base: str, deadline: float) -> dict[str, str]:
    """Every name the web UI knows its checkpoints by, mapped to the checkpoint's title; fetched
    from /sdapi/v1/sd-models and kept for a minute on the app."""
    cache = getattr(request.app.state, "sd_checkpoints", None)
    if cache is None:
        cache = request.app.state.sd_checkpoints = {}
    hit = cache.get(base)
    if hit and time.monotonic() - hit[0] < CHECKPOINTS_TTL:
        return hit[1]
    wait = max(0.5, min(10.0, deadline - time.monotonic()))
    titles = await anyio.to_thread.run_sync(_fetch_checkpoints, base, wait)
    cache[base] = (time.monotonic(), titles)
    return titles


def _fetch_checkpoints(base: str, timeout: float) -> dict[str, str]:
    import requests

    try:
        r = requests.get(f"{base}/sdapi/v1/sd-models", timeout=timeout)
        r.raise_for_status()
        items = r.json()
        return {alias: item["title"] for item in items for alias in _aliases(item)}
    except (requests.RequestException, ValueError, TypeError, KeyError, AttributeError) as e:
        log.warning("Could not list the web UI's checkpoints (%s); model names are ignored until it answers.",
                    type(e).__name__)
        return {}


def _aliases(item: dict[str, Any]) -> list[str]:
    """The names the web UI itself accepts for a checkpoint: its title, its name (the title without
    the hash), its short model name, its file name with and without extension, and its hashes."""
    title = item["title"]
    name = re.sub(r" \[[0-9a-f]+\]$", "", title)
    file = re.split(r"[\\/]", item.get("filename") or "")[-1]
    names = [title, name, item.get("model_name"), file, file.rsplit(".", 1)[0], item.get("hash"), item.get("sha256")]
    return [n for n in names if isinstance(n, str) and n]


async def _checkpoint(request: Request, base: str, model: str | None, deadline: float) -> str | None:
    if not model or model in OPENAI_IMAGE_MODELS:
        return None
    title = (await _checkpoint_titles(request, base, deadline)).get(model)
    if title is None:
        log.info("Image model %r is not a checkpoint of the web UI; its loaded checkpoint is used.", model)
    return title


async def _generate(request: Request, endpoint: str, payload: dict[str, Any], n: int,
                    response_format: str | None, model: str | None) -> dict[str, Any]:
    base, timeout = _base_url(request)
    deadline = time.monotonic() + timeout
    checkpoint = await _checkpoint(request, base, model, deadline)
    if checkpoint:
        payload["override_settings"] = {"sd_model_checkpoint": checkpoint}
    call = _WebUiCall(request.app.state.api.limiter("images.webui", WEB_UI_CALLS))
    try:
        images = await call.run(deadline - time.monotonic(), _call_sd, base, endpoint, payload, deadline, timeout)
    except (TimeoutError, GatewayTimeout):
        if call.started:
            _stop_abandoned_job(base, endpoint)
        raise _too_slow(timeout) from None
    images = [i.split(",", 1)[1] if i.startswith("data:") else i for i in images][:n]
    as_url = (response_format or default_response_format(model)) == "url"
    data = [{"url": f"data:image/png;base64,{img}"} if as_url else {"b64_json": img} for img in images]
    return {"created": int(time.time()), "data": data}


@router.post("/generations")
async def generations(body: ImageGenerationRequest, request: Request):
    refuse_unknown_fields(body, request.app.state.api.settings.allow_unknown_fields)
    _check_common(body.output_format, body.stream, body.background)
    width, height = parse_size(body.size, (512, 512))
    n = body.n or 1
    payload = {"prompt": body.prompt, "negative_prompt": "", "width": width, "height": height,
               "batch_size": n, "n_iter": 1, "seed": -1, **_sd_settings(body.quality, body.style)}
    return await _generate(request, "txt2img", payload, n, body.response_format, body.model)


# --- edits and variations: multipart uploads ---------------------------------------------------

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
    return tuple(min(SIDE_MAX, max(SIDE_MIN, round(side * scale / 8) * 8)) for side in (width, height))


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


def _prepare_images(image: tuple[str | None, bytes], mask: tuple[str | None, bytes] | None
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


def _form_text(form, name: str) -> str | None:
    """The one way to read a text field of the form: None when absent, else its string value. A file
    part under a text field's name, or the field given twice, is the client's mistake: a 400 naming it."""
    values = form.getlist(name)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequestError(f"'{name}' was given {len(values)} times; give it once.", param=name)
    if not isinstance(values[0], str):
        raise InvalidRequestError(
            f"'{name}' must be a text field, but it was sent as a file"
            f"{f' ({values[0].filename})' if getattr(values[0], 'filename', None) else ''}; send its value as "
            f"plain text (e.g. curl -F '{name}=...', not -F '{name}=@file').", param=name)
    return values[0]


def _form_int(form, name: str, low: int, high: int, default: int) -> int:
    raw = _form_text(form, name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} must be an integer.", param=name) from None
    if not low <= value <= high:
        raise InvalidRequestError(f"{name} must be from {low} to {high}.", param=name)
    return value


def _form_choice(form, name: str, choices: tuple[str, ...]) -> str | None:
    value = _form_text(form, name)
    if value in (None, ""):
        return None
    if value not in choices:
        raise InvalidRequestError(f"{name} must be one of {', '.join(choices)}.", param=name)
    return value


async def _upload(form, name: str, required: bool) -> tuple[str | None, bytes] | None:
    items = form.getlist(name) or form.getlist(f"{name}[]")
    files = [i for i in items if not isinstance(i, str)]
    if not files:
        if items:
            raise InvalidRequestError(f"'{name}' must be sent as a file, not as a text field "
                                      f"(e.g. curl -F '{name}=@picture.png').", param=name)
        if required:
            raise InvalidRequestError(f"Missing required file '{name}'; send it as multipart/form-data.", param=name)
        return None
    return files[0].filename, await files[0].read()


async def _img2img(request: Request, *, need_prompt: bool) -> dict[str, Any]:
    # the uploads' spooled files are closed as soon as the form is read, whatever happens
    async with request.form() as form:
        payload, n, response_format, model = await _read_img2img(request, form, need_prompt=need_prompt)
    return await _generate(request, "img2img", payload, n, response_format, model)


async def _read_img2img(request: Request, form, *, need_prompt: bool
                        ) -> tuple[dict[str, Any], int, str | None, str | None]:
    prompt = _form_text(form, "prompt")
    if need_prompt and (prompt is None or not prompt.strip()):
        raise InvalidRequestError("Missing required parameter: 'prompt'.", param="prompt")
    n = _form_int(form, "n", 1, 10, 1)
    response_format = _form_choice(form, "response_format", ("url", "b64_json"))
    _check_common(_form_choice(form, "output_format", ("png", "jpeg", "webp")),
                  (_form_text(form, "stream") or "").lower() in ("true", "1"),
                  _form_choice(form, "background", ("transparent", "opaque", "auto")))
    size = parse_size(_form_text(form, "size") or None, None)   # None: from the image, see default_size
    quality = _form_choice(form, "quality", tuple(STEPS))
    model = _form_text(form, "model")
    image = await _upload(form, "image", required=True)
    mask = await _upload(form, "mask", required=False)
    # one upload decoded at a time: a few large images at once would take gigabytes
    init, image_size, sd_mask = await anyio.to_thread.run_sync(
        _prepare_images, image, mask, limiter=request.app.state.api.limiter("images.decode"))
    width, height = size or default_size(*image_size)
    payload: dict[str, Any] = {
        "prompt": prompt or "", "negative_prompt": "", "init_images": [init],
        "width": width, "height": height, "batch_size": n, "n_iter": 1, "seed": -1,
        "denoising_strength": 0.75 if need_prompt else 0.6, **_sd_settings(quality, None)}
    if sd_mask is not None:
        payload.update(mask=sd_mask, inpainting_fill=1, inpaint_full_res=False)
    return payload, n, response_format, model


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
