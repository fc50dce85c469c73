"""The web UI's image model (the diffusers pipeline its Image tab loads), driven as the web UI's
own API drives it (modules/api/images.py): a state of the Image tab's keys, then its
``ui_image_generation.generate(state, save_images=False)`` run to its last yield, which holds the
images as PIL images.

Steps and CFG scale are the Image tab's settings (chosen there for the loaded model: a turbo model
wants a few steps and no guidance); the seed is random. The pipeline renders one request at a
time: two calls at once on one pipeline would share its scheduler state.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

# the Image tab's settings generate() reads, with the web UI's defaults
_DEFAULTS = {"image_steps": 9, "image_cfg_scale": 0.0, "image_dtype": "bfloat16", "image_attn_backend": "sdpa",
             "image_cpu_offload": False, "image_compile": False, "image_quant": "none"}
_ONE_AT_A_TIME = threading.Lock()


class WebUiImages:
    """The image model loaded in the web UI's Image tab."""

    def __init__(self, shared: Any):
        self.shared = shared

    @property
    def name(self) -> str:
        return str(self.shared.image_model_name)

    def default_size(self) -> tuple[int, int]:
        """The Image tab's width and height: what the loaded model was set up for."""
        settings = self.shared.settings
        return int(settings.get("image_width", 1024)), int(settings.get("image_height", 1024))

    def generate(self, prompt: str, width: int, height: int, n: int) -> list[Any]:
        """``n`` images (PIL), in one batch of the pipeline, as the web UI's API asks for ``n``.
        Blocking; an empty list when the web UI's generate() failed (it logs why)."""
        ui = importlib.import_module("modules.ui_image_generation")
        settings = self.shared.settings
        state: dict[str, Any] = {k: settings.get(k, v) for k, v in _DEFAULTS.items()}
        state.update(image_model_menu=self.shared.image_model_name, image_prompt=prompt, image_neg_prompt="",
                     image_width=width, image_height=height, image_seed=-1, image_batch_size=n,
                     image_batch_count=1, image_llm_variations=False)
        images: list[Any] = []
        with _ONE_AT_A_TIME:
            for batch, _ in ui.generate(state, save_images=False):
                images = batch   # each yield holds every image so far: the last one holds them all
        return list(images)


def loaded(shared: Any) -> WebUiImages | None:
    """The web UI's image model, when its Image tab has one loaded."""
    if getattr(shared, "image_model", None) is None:
        return None
    return WebUiImages(shared)
