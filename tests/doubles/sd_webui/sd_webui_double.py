"""Test double of a Stable Diffusion web UI's API (AUTOMATIC1111's /sdapi/v1).

It follows the real contract for the two calls the images proxy makes:
  POST /sdapi/v1/txt2img  {prompt, negative_prompt, width, height, steps, cfg_scale, batch_size, n_iter,
                           seed, override_settings, ...}
  POST /sdapi/v1/img2img  the same plus {init_images: [base64], mask: base64, denoising_strength, ...}
and answers as the real one does: {"images": [base64 PNG, ...], "parameters": {the request}, "info": "<json>"},
one image per batch item, each a real PNG of the requested width x height.

Behaviours for tests: ``delay`` (seconds before answering), ``fail_status`` (answer that HTTP status).
Every request body is kept in ``requests``.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image


class SdWebUiDouble:
    def __init__(self):
        self.requests: list[tuple[str, dict]] = []
        self.delay = 0.0
        self.fail_status: int | None = None
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                double.requests.append((self.path, body))
                time.sleep(double.delay)
                if double.fail_status:
                    return self._send(double.fail_status, {"detail": "double: model crashed"})
                if self.path not in ("/sdapi/v1/txt2img", "/sdapi/v1/img2img"):
                    return self._send(404, {"detail": "Not Found"})
                count = int(body.get("batch_size", 1)) * int(body.get("n_iter", 1))
                images = [_png(int(body.get("width", 512)), int(body.get("height", 512)), i) for i in range(count)]
                self._send(200, {"images": images, "parameters": body, "info": json.dumps({"seed": 1234})})

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _png(width: int, height: int, index: int) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (40 * index % 256, 120, 200)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()
