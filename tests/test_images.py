"""/v1/images/* through the official client, against a double of the Stable Diffusion web UI."""

from __future__ import annotations

import base64
import io
import socket
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image

from conftest import openai_client
from openai_spec import assert_valid

sys.path.insert(0, str(Path(__file__).parent / "doubles" / "sd_webui"))
from sd_webui_double import SdWebUiDouble  # noqa: E402


@pytest.fixture
def sd():
    double = SdWebUiDouble()
    yield double
    double.close()


@pytest.fixture
def server(sd, llama_host, make_server):
    return make_server(llama_host, sd_webui_url=sd.url, sd_timeout=2)


def png_size(b64: str) -> tuple[int, int]:
    return Image.open(io.BytesIO(base64.b64decode(b64))).size


def test_generation_maps_openai_parameters_onto_txt2img(server, sd):
    client = openai_client(server)
    raw = client.images.with_raw_response.generate(prompt="a lighthouse at dusk", n=2, size="512x768",
                                                   quality="hd", style="natural", response_format="b64_json",
                                                   model="dall-e-3", user="u1")
    assert_valid("ImagesResponse", raw.http_response.json())
    resp = raw.parse()
    assert len(resp.data) == 2 and all(png_size(d.b64_json) == (512, 768) for d in resp.data)
    path, req = sd.requests[-1]
    assert path == "/sdapi/v1/txt2img"
    assert (req["prompt"], req["width"], req["height"], req["batch_size"]) == ("a lighthouse at dusk", 512, 768, 2)
    assert req["steps"] == 40 and req["cfg_scale"] == 5.0 and "override_settings" not in req


def test_default_is_a_data_url_and_other_model_names_pick_a_checkpoint(server, sd):
    resp = openai_client(server).images.generate(prompt="a cat", model="dreamshaper_8.safetensors")
    url = resp.data[0].url
    assert url.startswith("data:image/png;base64,") and png_size(url.split(",", 1)[1]) == (512, 512)
    assert sd.requests[-1][1]["override_settings"] == {"sd_model_checkpoint": "dreamshaper_8.safetensors"}


def test_edit_with_mask_is_inpainting(server, sd):
    image = io.BytesIO()
    Image.new("RGB", (256, 256), "white").save(image, format="PNG")
    mask = Image.new("RGBA", (256, 256), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (0, 0, 128, 256))   # the left half is transparent: edit it
    mask_png = io.BytesIO()
    mask.save(mask_png, format="PNG")
    resp = openai_client(server).images.edit(image=("in.png", image.getvalue(), "image/png"),
                                             mask=("mask.png", mask_png.getvalue(), "image/png"),
                                             prompt="add a red door", response_format="b64_json", n=1)
    assert png_size(resp.data[0].b64_json) == (256, 256)
    path, req = sd.requests[-1]
    assert path == "/sdapi/v1/img2img" and req["prompt"] == "add a red door" and len(req["init_images"]) == 1
    sd_mask = Image.open(io.BytesIO(base64.b64decode(req["mask"])))
    assert sd_mask.getpixel((10, 10)) == 255 and sd_mask.getpixel((200, 10)) == 0   # white = repaint


def test_variation(server, sd):
    image = io.BytesIO()
    Image.new("RGB", (128, 128), "blue").save(image, format="PNG")
    resp = openai_client(server).images.create_variation(image=("v.png", image.getvalue(), "image/png"), n=3,
                                                         size="256x256", response_format="b64_json")
    assert len(resp.data) == 3 and png_size(resp.data[0].b64_json) == (256, 256)
    assert sd.requests[-1][1]["prompt"] == "" and sd.requests[-1][1]["denoising_strength"] == 0.6


@pytest.mark.parametrize("kwargs, param", [
    (dict(prompt="x", size="huge"), "size"),
    (dict(prompt="x", size="100x100"), "size"),
    (dict(prompt="x", n=11), "n"),
    (dict(prompt=""), "prompt"),
    (dict(prompt="x", output_format="webp"), "output_format"),
    (dict(prompt="x", quality="ultra"), "quality"),
])
def test_generation_errors(server, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client(server).images.generate(**kwargs)
    assert e.value.body["param"] == param
    assert_valid("ErrorResponse", e.value.response.json())


def test_edit_errors(server):
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.images.edit(image=("x.png", b"not an image", "image/png"), prompt="p")
    assert e.value.body["param"] == "image"
    good = io.BytesIO()
    Image.new("RGB", (64, 64)).save(good, format="PNG")
    with pytest.raises(openai.BadRequestError) as e:
        client.images.edit(image=("x.png", good.getvalue(), "image/png"), prompt="p",
                           mask=("m.png", good.getvalue(), "image/png"))     # no transparency
    assert e.value.body["param"] == "mask"
    r = httpx.post(server.url + "/images/edits", files={"image": ("x.png", good.getvalue(), "image/png")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_without_a_web_ui_the_error_says_how_to_enable_it(live):
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(live).images.generate(prompt="x")
    assert e.value.status_code == 503 and "sd_webui_url" in e.value.body["message"]
    assert_valid("ErrorResponse", e.value.response.json())


def test_web_ui_down_is_502(llama_host, make_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"   # closed when the with block ends
    server = make_server(llama_host, sd_webui_url=dead)
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 502 and "not reachable" in e.value.body["message"]


def test_web_ui_slow_is_504_and_never_hangs(server, sd):
    sd.delay = 5
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 504 and time.monotonic() - started < 4.5


def test_web_ui_error_is_502_with_its_message(server, sd):
    sd.fail_status = 500
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 502 and "model crashed" in e.value.body["message"]
