"""Test double of a Stable Diffusion web UI's API (AUTOMATIC1111's /sdapi/v1).

It follows the real contract for the calls the images proxy makes:
  POST /sdapi/v1/txt2img    {prompt, negative_prompt, width, height, steps, cfg_scale, batch_size, n_iter,
                             seed, override_settings, ...}
  POST /sdapi/v1/img2img    the same plus {init_images: [base64], mask: base64, denoising_strength, ...}
  GET  /sdapi/v1/sd-models  [{title, model_name, hash, sha256, filename, config}, ...]
  GET  /sdapi/v1/progress   {progress, eta_relative, state: {job, ...}, current_image, textinfo}
  POST /sdapi/v1/interrupt  {} (the job being rendered stops early and answers with what it has)
and answers as the real one does: {"images": [base64 PNG, ...], "parameters": {the request}, "info": "<json>"},
one image per batch item, each a real PNG of the requested width x height.

Request bodies are checked as the real API's pydantic models check them: a value of the wrong
type is a 422 with FastAPI's {"detail": [...]}. The double is stricter than the real API in one
way, on purpose: a field the real one does not have is a 422 too (the real one ignores it, so a
misspelt field would silently do nothing there).

Jobs run one at a time, as under the real one's queue lock; while one runs, /progress reports its
job name ("scripts_txt2img" for an API call, "task(...)" for one started in the web UI's own page).

Behaviours for tests: ``delay`` (seconds a job takes), ``fail_status`` (answer that HTTP status),
``images`` (answer this list, or None, as "images" instead of rendering), ``trickle`` (send the
answer a few bytes at a time, this many seconds apart), ``checkpoints`` (what /sd-models lists),
``ui_job(seconds)`` (a job from the web UI's own page holds the queue). Every POST body is kept in
``requests``; ``interrupts`` counts interrupt calls, ``progress_calls`` the /progress calls,
``model_list_calls`` the /sd-models calls, and ``max_in_flight`` is the most image requests it was
handling at once.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from PIL import Image
from pydantic import BaseModel, ConfigDict, ValidationError


class _Processing(BaseModel):
    """The fields of the real StableDiffusionProcessing that its API takes, all optional."""
    model_config = ConfigDict(extra="forbid")
    prompt: Optional[str] = ""
    negative_prompt: Optional[str] = ""
    styles: Optional[list[str]] = None
    seed: Optional[int] = -1
    subseed: Optional[int] = -1
    subseed_strength: Optional[float] = 0
    seed_resize_from_h: Optional[int] = -1
    seed_resize_from_w: Optional[int] = -1
    sampler_name: Optional[str] = None
    scheduler: Optional[str] = None
    batch_size: Optional[int] = 1
    n_iter: Optional[int] = 1
    steps: Optional[int] = 50
    cfg_scale: Optional[float] = 7.0
    width: Optional[int] = 512
    height: Optional[int] = 512
    restore_faces: Optional[bool] = None
    tiling: Optional[bool] = None
    do_not_save_samples: Optional[bool] = False
    do_not_save_grid: Optional[bool] = False
    eta: Optional[float] = None
    denoising_strength: Optional[float] = None
    s_min_uncond: Optional[float] = None
    s_churn: Optional[float] = None
    s_tmax: Optional[float] = None
    s_tmin: Optional[float] = None
    s_noise: Optional[float] = None
    override_settings: Optional[dict[str, Any]] = None
    override_settings_restore_afterwards: Optional[bool] = True
    refiner_checkpoint: Optional[str] = None
    refiner_switch_at: Optional[float] = None
    disable_extra_networks: Optional[bool] = False
    comments: Optional[dict] = None
    # the API's own additions
    sampler_index: Optional[str] = "Euler"
    script_name: Optional[str] = None
    script_args: Optional[list] = []
    send_images: Optional[bool] = True
    save_images: Optional[bool] = False
    alwayson_scripts: Optional[dict] = {}
    force_task_id: Optional[str] = None
    infotext: Optional[str] = None


class Txt2Img(_Processing):
    enable_hr: Optional[bool] = False
    firstphase_width: Optional[int] = 0
    firstphase_height: Optional[int] = 0
    hr_scale: Optional[float] = 2.0
    hr_upscaler: Optional[str] = None
    hr_second_pass_steps: Optional[int] = 0
    hr_resize_x: Optional[int] = 0
    hr_resize_y: Optional[int] = 0
    hr_checkpoint_name: Optional[str] = None
    hr_sampler_name: Optional[str] = None
    hr_scheduler: Optional[str] = None
    hr_prompt: Optional[str] = ""
    hr_negative_prompt: Optional[str] = ""


class Img2Img(_Processing):
    init_images: Optional[list] = None
    resize_mode: Optional[int] = 0
    image_cfg_scale: Optional[float] = None
    mask: Optional[str] = None
    mask_blur_x: Optional[int] = 4
    mask_blur_y: Optional[int] = 4
    mask_blur: Optional[int] = None
    mask_round: Optional[bool] = True
    inpainting_fill: Optional[int] = 0
    inpaint_full_res: Optional[bool] = True
    inpaint_full_res_padding: Optional[int] = 0
    inpainting_mask_invert: Optional[int] = 0
    initial_noise_multiplier: Optional[float] = None
    latent_mask: Optional[str] = None
    include_init_images: Optional[bool] = False


MODELS = {"/sdapi/v1/txt2img": Txt2Img, "/sdapi/v1/img2img": Img2Img}

CHECKPOINTS = [
    {"title": "dreamshaper_8.safetensors [879db523c3]", "model_name": "dreamshaper_8", "hash": "879db523c3",
     "sha256": "879db523c30d3b9017143d56705015e15a2cb5628762c11d086fed9538abd7fd",
     "filename": "/srv/sd/models/Stable-diffusion/dreamshaper_8.safetensors", "config": None},
    {"title": "sdxl/juggernautXL_v9.safetensors [c9e3e68f89]", "model_name": "sdxl_juggernautXL_v9",
     "hash": "c9e3e68f89", "sha256": None,
     "filename": "/srv/sd/models/Stable-diffusion/sdxl/juggernautXL_v9.safetensors", "config": None},
]


class SdWebUiDouble:
    def __init__(self):
        self.requests: list[tuple[str, dict]] = []
        self.delay = 0.0
        self.fail_status: int | None = None
        self.images: list | None | str = "render"
        self.trickle: float | None = None
        self.checkpoints = [dict(c) for c in CHECKPOINTS]
        self.interrupts = 0
        self.progress_calls = 0
        self.model_list_calls = 0
        self.job = ""                        # what /progress reports as state.job
        self.in_flight = self.max_in_flight = 0   # image requests being handled at once
        self._count_lock = threading.Lock()
        self._queue = threading.Lock()       # one job at a time, as the real one's queue lock
        self._interrupt = threading.Event()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0]
                if path == "/sdapi/v1/sd-models":
                    double.model_list_calls += 1
                    return self._send(200, double.checkpoints)
                if path == "/sdapi/v1/progress":
                    double.progress_calls += 1
                    state = {"skipped": False, "interrupted": double._interrupt.is_set(), "job": double.job,
                             "job_count": 1 if double.job else 0, "job_timestamp": "0", "job_no": 0,
                             "sampling_step": 0, "sampling_steps": 0}
                    return self._send(200, {"progress": 0.5 if double.job else 0, "eta_relative": 0,
                                            "state": state, "current_image": None, "textinfo": None})
                self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/sdapi/v1/interrupt":
                    double.interrupts += 1
                    double._interrupt.set()
                    return self._send(200, {})
                model = MODELS.get(self.path)
                if model is None:
                    return self._send(404, {"detail": "Not Found"})
                try:
                    body = json.loads(raw)
                    model.model_validate(body)
                except json.JSONDecodeError as e:
                    return self._send(422, {"detail": [{"loc": ["body", e.pos], "msg": "JSON decode error",
                                                        "type": "json_invalid"}]})
                except ValidationError as e:
                    return self._send(422, {"detail": [{"loc": ["body", *err["loc"]], "msg": err["msg"],
                                                        "type": err["type"]} for err in e.errors()]})
                double.requests.append((self.path, body))
                # (counted until the answer is ready, not sent: a client that has read it may send
                # its next request before this thread leaves, and that is not two jobs at once)
                with double._counting():
                    with double._queue:
                        double.job = f"scripts_{self.path.rsplit('/', 1)[1]}"
                        double._interrupt.clear()
                        try:
                            double._interrupt.wait(double.delay)
                            answer = double._answer(body)
                        finally:
                            double.job = ""
                if double.fail_status:
                    return self._send(double.fail_status, {"detail": "double: model crashed"})
                self._send(200, answer)

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    if double.trickle and status == 200 and "images" in payload:
                        for i in range(0, len(data), 64):
                            self.wfile.write(data[i:i + 64])
                            self.wfile.flush()
                            time.sleep(double.trickle)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @contextlib.contextmanager
    def _counting(self):
        with self._count_lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._count_lock:
                self.in_flight -= 1

    def _answer(self, body: dict) -> dict:
        if self.images != "render":
            images = self.images
        else:
            count = int(body.get("batch_size") or 1) * int(body.get("n_iter") or 1)
            images = [_png(int(body.get("width") or 512), int(body.get("height") or 512), i) for i in range(count)]
        return {"images": images, "parameters": body, "info": json.dumps({"seed": 1234})}

    def ui_job(self, seconds: float) -> threading.Thread:
        """A job started in the web UI's own page: it holds the queue for ``seconds`` (or until
        interrupted)."""
        started = threading.Event()

        def run():
            with self._queue:
                self.job = "task(double-ui-job)"
                self._interrupt.clear()
                started.set()
                self._interrupt.wait(seconds)
                self.job = ""

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        started.wait(5)
        return thread

    def close(self):
        self._interrupt.set()
        self.server.shutdown()
        self.server.server_close()


def _png(width: int, height: int, index: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (40 * index % 256, 120, 200)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()
