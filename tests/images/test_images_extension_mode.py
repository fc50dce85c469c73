"""/v1/images/generations in extension mode, through the image model loaded in the web UI's Image
tab (the double of its ui_image_generation.generate, driven as the web UI's own API drives it),
and the Stable Diffusion web UI proxy when no image model is loaded there."""

from __future__ import annotations

import base64
import io
import sys

import httpx
import openai
import pytest
from PIL import Image
from support import DOUBLES
from support.servers import free_port
from support.spec import assert_valid, error_of
from support.webui import load_extension


@pytest.fixture
def client(extension):
    return openai.OpenAI(base_url=extension.server.url, api_key="x", max_retries=0,
                         _strict_response_validation=True, timeout=30)


def load_image_model(host_modules, **kw):
    """As the web UI's Image tab does when it loads a model (load_image_model_wrapper)."""
    shared = host_modules.shared
    shared.image_model = host_modules.ui_image_generation.ImagePipeline(**kw)
    shared.image_model_name = shared.settings["image_model_menu"] = "Z-Image-Turbo"
    return shared.image_model


def png_of(b64):
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def test_the_web_uis_image_model_draws_them(client, host_modules):
    pipe = load_image_model(host_modules)
    raw = client.images.with_raw_response.generate(prompt="a red square", n=2, size="1536x1024",
                                                   response_format="b64_json")
    assert_valid("ImagesResponse", raw.http_response.json())
    images = [png_of(d.b64_json) for d in raw.parse().data]
    assert [i.size for i in images] == [(1536, 1024), (1536, 1024)] and images[0].format == "PNG"
    # one batch of n, as the web UI's API asks; the Image tab's steps and CFG scale; images not saved
    state, save_images = host_modules.ui_image_generation.CALLS[-1]
    assert save_images is False and state["image_batch_size"] == 2 and state["image_batch_count"] == 1
    assert state["image_model_menu"] == "Z-Image-Turbo" and state["image_prompt"] == "a red square"
    kw = pipe.calls[-1]
    assert (kw["width"], kw["height"], kw["num_inference_steps"], kw["guidance_scale"]) == (1536, 1024, 9, 0.0)
    assert kw["num_images_per_prompt"] == 2 and kw["prompt"] == "a red square"


def test_defaults_url_and_the_image_tabs_size(client, host_modules):
    load_image_model(host_modules)
    host_modules.shared.settings.update(image_width=768, image_height=512, image_steps=4)
    raw = client.images.with_raw_response.generate(prompt="x", model="dall-e-2")
    assert_valid("ImagesResponse", raw.http_response.json())
    (only,) = raw.parse().data
    assert only.url.startswith("data:image/png;base64,") and only.b64_json is None
    assert png_of(only.url.split(",", 1)[1]).size == (768, 512)
    assert host_modules.shared.image_model.calls[-1]["num_inference_steps"] == 4
    # a GPT image model answers base64, as OpenAI's does
    assert client.images.generate(prompt="x", model="gpt-image-1").data[0].b64_json


@pytest.mark.parametrize("body, param", [
    ({"size": "1000x1000"}, "size"),            # not a multiple of 16
    ({"size": "big"}, "size"),
    ({"n": 11}, "n"),
    ({"output_format": "jpeg"}, "output_format"),
])
def test_bad_requests_name_the_parameter(extension, host_modules, body, param):
    load_image_model(host_modules)
    err = error_of(httpx.post(f"{extension.server.url}/images/generations", json={"prompt": "x", **body},
                              timeout=30), 400)
    assert err["param"] == param and err["message"], err
    assert host_modules.ui_image_generation.CALLS == []


def test_a_failed_generation_is_a_500_that_says_where_to_look(extension, host_modules):
    load_image_model(host_modules, fail=RuntimeError("CUDA out of memory"))
    err = error_of(httpx.post(f"{extension.server.url}/images/generations", json={"prompt": "x"}, timeout=30), 500)
    assert err["type"] == "server_error" and "Z-Image-Turbo" in err["message"] and "console" in err["message"]
    assert "CUDA" not in err["message"]
    assert "Image generation failed" in "\n".join(host_modules.logging_colors.logger.buffer)


def test_neither_an_image_model_nor_a_stable_diffusion_web_ui(extension, host_modules):
    assert host_modules.shared.image_model is None
    r = httpx.post(f"{extension.server.url}/images/generations", json={"prompt": "x"}, timeout=30)
    err = error_of(r, 503)
    assert err["code"] == "images_not_configured" and "Image tab" in err["message"] and "sd_webui_url" in err["message"]


@pytest.fixture
def sd():
    sys.path.insert(0, str(DOUBLES / "sd_webui"))
    from sd_webui_double import SdWebUiDouble

    double = SdWebUiDouble()
    yield double
    double.close()


def test_without_an_image_model_the_stable_diffusion_web_ui_draws_them(host_modules, sd):
    host_modules.shared.settings["openai_ext-port"] = free_port()
    host_modules.shared.settings["openai_ext-sd_webui_url"] = sd.url
    ext = load_extension(host_modules.shared)
    try:
        client = openai.OpenAI(base_url=ext.server.url, api_key="x", max_retries=0, timeout=30)
        assert client.images.generate(prompt="a cat", response_format="b64_json").data[0].b64_json
        assert host_modules.ui_image_generation.CALLS == []
    finally:
        ext.server.stop()
