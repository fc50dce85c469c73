"""The client of a Stable Diffusion web UI's API (AUTOMATIC1111-style /sdapi/v1).

Calls run on a worker thread, one at a time, within an overall deadline (sd_timeout), so a slow or
dead web UI gives a 504 or 502, never a hang; a job abandoned at the deadline is interrupted in the
web UI. The web UI's credentials (sd_webui_url may carry them) never reach a client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from typing import Any, Callable

import anyio

from ..core.config import Settings
from ..core.errors import OpenAIError, ServiceUnavailableError, UpstreamError

log = logging.getLogger(__name__)

# OpenAI's model names mean "whatever checkpoint the web UI has loaded". Any other name picks one
# of the web UI's checkpoints (by its title, name, file name or hash) when /sdapi/v1/sd-models lists
# it, and is ignored otherwise: for a name it does not know, the web UI would load some other
# checkpoint in its place.
OPENAI_IMAGE_MODELS = {"dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini", "gpt-image-1.5", "gpt-image-2",
                       "chatgpt-image-latest"}
# The web UI renders one job at a time; more calls at once would only wait in its queue, holding
# threads of this server.
WEB_UI_CALLS = 1
CHECKPOINTS_TTL = 60.0               # seconds a /sd-models answer is reused
MAX_ANSWER_BYTES = 256 * 2 ** 20     # ten 2048x2048 PNGs in base64 fit well within this


class GatewayTimeout(OpenAIError):
    status = 504
    type = "server_error"


def without_credentials(text: str) -> str:
    """Every URL in the text without its user:password@: the web UI's credentials (sd_webui_url may
    carry them for its --api-auth) are not the client's business."""
    return re.sub(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@", r"\1", text)


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


class SdClient:
    """One web UI: its address from the settings, its call slots, and its checkpoint names."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._calls: anyio.CapacityLimiter | None = None
        self._checkpoints: dict[str, tuple[float, dict[str, str]]] = {}   # base URL -> (when, names)

    @property
    def calls(self) -> anyio.CapacityLimiter:
        if self._calls is None:   # made on first use, inside the event loop
            self._calls = anyio.CapacityLimiter(WEB_UI_CALLS)
        return self._calls

    def base_url(self) -> tuple[str, float]:
        settings = self.settings
        if not settings.sd_webui_url:
            raise ServiceUnavailableError(
                "Image generation is off: start a Stable Diffusion web UI with its API enabled (--api) and set "
                "sd_webui_url (or the SD_WEBUI_URL environment variable) to its address, e.g. http://127.0.0.1:7860.",
                code="images_not_configured", retry=False)
        return settings.sd_webui_url.rstrip("/"), settings.sd_timeout

    async def _checkpoint_titles(self, base: str, deadline: float) -> dict[str, str]:
        """Every name the web UI knows its checkpoints by, mapped to the checkpoint's title; fetched
        from /sdapi/v1/sd-models and kept for a minute."""
        hit = self._checkpoints.get(base)
        if hit and time.monotonic() - hit[0] < CHECKPOINTS_TTL:
            return hit[1]
        wait = max(0.5, min(10.0, deadline - time.monotonic()))
        titles = await anyio.to_thread.run_sync(_fetch_checkpoints, base, wait)
        self._checkpoints[base] = (time.monotonic(), titles)
        return titles

    async def _checkpoint(self, base: str, model: str | None, deadline: float) -> str | None:
        if not model or model in OPENAI_IMAGE_MODELS:
            return None
        title = (await self._checkpoint_titles(base, deadline)).get(model)
        if title is None:
            log.info("Image model %r is not a checkpoint of the web UI; its loaded checkpoint is used.", model)
        return title

    async def images(self, endpoint: str, payload: dict[str, Any], model: str | None) -> list[str]:
        """The web UI's images (base64 PNG) for a txt2img or img2img payload."""
        base, timeout = self.base_url()
        deadline = time.monotonic() + timeout
        checkpoint = await self._checkpoint(base, model, deadline)
        if checkpoint:
            payload["override_settings"] = {"sd_model_checkpoint": checkpoint}
        call = _WebUiCall(self.calls)
        try:
            images = await call.run(deadline - time.monotonic(), _call_sd, base, endpoint, payload, deadline, timeout)
        except (TimeoutError, GatewayTimeout):
            if call.started:
                _stop_abandoned_job(base, endpoint)
            raise _too_slow(timeout) from None
        return [i.split(",", 1)[1] if i.startswith("data:") else i for i in images]


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

