"""Images for the tests of image inputs, and a vision model loaded in the web UI double."""

from __future__ import annotations

import base64
import io

from PIL import Image


def encoded(color, size=(4, 3), fmt="PNG") -> str:
    """A small one-colour image, base64-encoded."""
    buffered = io.BytesIO()
    Image.new("RGB", size, color).save(buffered, format=fmt)
    return base64.b64encode(buffered.getvalue()).decode()


def data_url(color, size=(4, 3), fmt="PNG") -> str:
    return f"data:image/{fmt.lower()};base64," + encoded(color, size, fmt)


def load_vision_model(host_modules) -> None:
    """As the web UI does when a model is loaded with --mmproj (models.load_model)."""
    shared = host_modules.shared
    shared.args.mmproj = "mmproj-Double-Model.gguf"
    shared.model, shared.tokenizer = host_modules.models.load_model(shared.model_name, "llama.cpp")
    assert shared.is_multimodal
