"""/v1/images/* through the official client, against a double of the Stable Diffusion web UI."""

from __future__ import annotations

import base64
import io
import socket
import struct
import sys
import threading
import time
import zlib

import httpx
import openai
import pytest
from PIL import Image
from support import DOUBLES
from support.servers import openai_client
from support.spec import assert_valid

from openai_ext.images import service as images_module

sys.path.insert(0, str(DOUBLES / "sd_webui"))
from sd_webui_double import SdWebUiDouble  # noqa: E402

pytestmark = pytest.mark.slow  # the Stable Diffusion web UI double answers on its own clock


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


def png(width: int, height: int, mode: str = "RGB", color=0) -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), color).save(out, format="PNG")
    return out.getvalue()


def black_png(width: int, height: int) -> bytes:
    """A valid 1-bit black PNG of any size, built without holding its pixels: a 20000x20000 one is ~48 KB."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    row = b"\0" * (1 + (width + 7) // 8)            # filter byte + packed bits
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def post_form(server, route: str, files: dict, data: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/images/{route}", files=files, data=data or {}, timeout=60)


def assert_400(r: httpx.Response, param: str, *words: str) -> str:
    assert r.status_code == 400, r.text
    assert_valid("ErrorResponse", r.json())
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert all(w in error["message"] for w in words), error["message"]
    return error["message"]


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
    # sent as the web UI's title for it, which the web UI matches exactly
    title = "dreamshaper_8.safetensors [879db523c3]"
    assert sd.requests[-1][1]["override_settings"] == {"sd_model_checkpoint": title}


@pytest.mark.parametrize("name, title", [
    ("dreamshaper_8", "dreamshaper_8.safetensors [879db523c3]"),
    ("879db523c3", "dreamshaper_8.safetensors [879db523c3]"),
    ("dreamshaper_8.safetensors [879db523c3]", "dreamshaper_8.safetensors [879db523c3]"),
    ("sdxl/juggernautXL_v9.safetensors", "sdxl/juggernautXL_v9.safetensors [c9e3e68f89]"),
    ("juggernautXL_v9", "sdxl/juggernautXL_v9.safetensors [c9e3e68f89]"),
    ("sdxl_juggernautXL_v9", "sdxl/juggernautXL_v9.safetensors [c9e3e68f89]"),
])
def test_checkpoints_go_by_the_names_the_web_ui_knows_them_by(server, sd, name, title):
    openai_client(server).images.generate(prompt="a cat", model=name, response_format="b64_json")
    assert sd.requests[-1][1]["override_settings"] == {"sd_model_checkpoint": title}


def test_an_unknown_model_name_is_ignored_and_the_checkpoint_list_is_cached(server, sd):
    client = openai_client(server)
    # the web UI would load some other checkpoint for a name it does not know: none is sent
    client.images.generate(prompt="a cat", model="no-such-checkpoint", response_format="b64_json")
    assert "override_settings" not in sd.requests[-1][1]
    client.images.generate(prompt="a cat", model="dreamshaper_8", response_format="b64_json")
    assert sd.requests[-1][1]["override_settings"]["sd_model_checkpoint"].startswith("dreamshaper_8")
    assert sd.model_list_calls == 1      # listed once, then reused
    client.images.generate(prompt="a cat", model="dall-e-2", response_format="b64_json")
    assert "override_settings" not in sd.requests[-1][1] and sd.model_list_calls == 1


def test_gpt_image_models_answer_base64_by_default(server, sd):
    client = openai_client(server)
    for model in ("gpt-image-1", "gpt-image-1-mini", "chatgpt-image-latest"):
        data = client.images.generate(prompt="a cat", model=model).data[0]
        assert data.url is None and png_size(data.b64_json) == (512, 512), model
    assert client.images.generate(prompt="a cat", model="dall-e-3").data[0].url.startswith("data:image/png")
    r = post_form(server, "edits", {"image": ("in.png", png(64, 64), "image/png")},
                  {"prompt": "p", "model": "gpt-image-1"})
    assert "b64_json" in r.json()["data"][0] and "url" not in r.json()["data"][0]


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
    # a setting of the server: retrying cannot help, and the SDKs are told so
    assert e.value.response.headers["x-should-retry"] == "false"


def test_the_sd_webui_url_environment_variable_turns_it_on(sd, llama_host, monkeypatch, tmp_path):
    from openai_ext.app import create_app
    from openai_ext.core.config import load_settings
    from openai_ext.core.server import ApiServer

    monkeypatch.delenv("OPENEDAI_SD_WEBUI_URL", raising=False)
    monkeypatch.setenv("SD_WEBUI_URL", sd.url)
    settings = load_settings(cli={"port": 0}, file=tmp_path / "none.json")
    server = ApiServer(create_app(settings, llama_host), settings).start()
    try:
        resp = openai_client(server).images.generate(prompt="a fox", response_format="b64_json")
        assert png_size(resp.data[0].b64_json) == (512, 512) and sd.requests[-1][1]["prompt"] == "a fox"
    finally:
        server.stop()


def test_web_ui_down_is_502(llama_host, make_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"   # closed when the with block ends
    server = make_server(llama_host, sd_webui_url=dead.replace("http://", "http://sd-user:sd-secret@"))
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 502 and "not reachable" in e.value.body["message"]
    # the address is told, the web UI's credentials are not
    assert dead in e.value.body["message"] and "sd-secret" not in e.value.body["message"]
    assert "sd-user" not in e.value.body["message"]


def wait_for(condition, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_web_ui_slow_is_504_and_never_hangs(server, sd):
    sd.delay = 5                          # longer than the server's sd_timeout: the answer is a 504
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 504
    # the job left behind is interrupted, so the web UI does not go on rendering it
    assert wait_for(lambda: sd.interrupts == 1)


def test_a_job_from_the_web_uis_own_page_is_never_interrupted(server, sd):
    sd.ui_job(4)                          # someone renders in the web UI; our job waits behind it
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 504
    # the server asked the web UI which job runs, and its check has ended: it left that job alone
    assert wait_for(lambda: sd.progress_calls >= 1 and not any(
        t.name == "sd-interrupt" and t.is_alive() for t in threading.enumerate()))
    assert sd.interrupts == 0


def test_a_web_ui_that_answers_slowly_is_cut_off_at_the_deadline(server, sd):
    sd.trickle = 0.2                      # each read is quick, the whole answer would take many seconds
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 504


def test_web_ui_calls_run_one_at_a_time(server, sd):
    sd.delay = 0.3
    results = []
    threads = [threading.Thread(target=lambda: results.append(httpx.post(
        f"{server.url}/images/generations", json={"prompt": "x", "response_format": "b64_json"}, timeout=30)))
        for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.status_code for r in results] == [200, 200, 200]
    assert sd.max_in_flight == 1


@pytest.mark.parametrize("images", [[], None])
def test_a_web_ui_answer_without_images_is_502(server, sd, images):
    sd.images = images
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 502 and "without images" in e.value.body["message"]


def test_the_web_ui_double_refuses_what_the_real_api_refuses(sd):
    """The double is a contract check: a field the web UI does not have, or a value of the wrong
    type, is a 422 there, so the proxy's requests above are known to fit the real API."""
    for body in ({"prompt": "x", "widht": 512}, {"prompt": "x", "width": "wide"},
                 {"prompt": "x", "override_settings": "dreamshaper_8"}):
        assert httpx.post(f"{sd.url}/sdapi/v1/txt2img", json=body).status_code == 422, body
    assert httpx.post(f"{sd.url}/sdapi/v1/img2img", json={"init_images": [], "mask": 3}).status_code == 422
    assert httpx.post(f"{sd.url}/sdapi/v1/txt2img", json={"prompt": "x", "width": 64, "height": 64}).status_code == 200


def test_web_ui_error_is_502_with_its_message(server, sd):
    sd.fail_status = 500
    with pytest.raises(openai.APIStatusError) as e:
        openai_client(server).images.generate(prompt="x")
    assert e.value.status_code == 502 and "model crashed" in e.value.body["message"]


# --- multipart edge cases --------------------------------------------------------------------

@pytest.mark.parametrize("route, field, value", [
    ("edits", "prompt", b"add a door"),
    ("edits", "size", b"256x256"),
    ("edits", "model", b"dall-e-2"),
    ("edits", "n", b"2"),
    ("edits", "response_format", b"b64_json"),
    ("edits", "quality", b"hd"),
    ("edits", "stream", b"false"),
    ("edits", "background", b"auto"),
    ("edits", "output_format", b"png"),
    ("variations", "size", b"256x256"),
    ("variations", "model", b"dall-e-2"),
    ("variations", "n", b"2"),
    ("variations", "response_format", b"url"),
])
def test_a_text_field_sent_as_a_file_is_a_400_naming_it(server, sd, route, field, value):
    data = {} if field == "prompt" or route == "variations" else {"prompt": "add a door"}
    r = post_form(server, route, {"image": ("in.png", png(64, 64), "image/png"),
                                  field: (f"{field}.txt", value, "text/plain")}, data)
    message = assert_400(r, field, "text field", "sent as a file")
    assert f"{field}.txt" in message
    assert sd.requests == []


def test_a_text_field_given_twice_and_an_image_sent_as_text_are_400s(server, sd):
    r = httpx.post(f"{server.url}/images/variations", timeout=60,
                   files=[("image", ("in.png", png(64, 64), "image/png")), ("n", (None, b"1")), ("n", (None, b"2"))])
    assert_400(r, "n", "2 times")
    r = post_form(server, "edits", {"prompt": (None, b"p"), "image": (None, b"not a file")})
    assert_400(r, "image", "as a file")
    assert sd.requests == []


@pytest.mark.parametrize("route", ["edits", "variations"])
def test_a_decompression_bomb_is_a_400_stating_the_limit(server, sd, route):
    bomb = black_png(20000, 20000)
    assert len(bomb) < 64_000                          # tiny on the wire, 400 megapixels decoded
    r = post_form(server, route, {"image": ("bomb.png", bomb, "image/png")}, {"prompt": "p"})
    assert_400(r, "image", "16,777,216 pixels", "4096x4096", "Scale the image down")
    assert sd.requests == []


def test_an_image_over_the_pixel_cap_but_under_pils_is_a_400_too(server, sd):
    r = post_form(server, "variations", {"image": ("big.png", black_png(9000, 9000), "image/png")})
    assert_400(r, "image", "9000x9000 pixels", "4096x4096")
    good = png(64, 64)
    r = post_form(server, "edits", {"image": ("in.png", good, "image/png"),
                                    "mask": ("m.png", black_png(5000, 5000), "image/png")}, {"prompt": "p"})
    assert_400(r, "mask", "5000x5000 pixels")
    assert sd.requests == []


@pytest.mark.parametrize("upload, expected", [
    ((3000, 1500), (2048, 1024)),    # too big: scaled down, aspect ratio kept
    ((1000, 333), (1000, 336)),      # rounded to multiples of 8
    ((40, 20), (128, 64)),           # too small: scaled up to the 64 minimum
    ((512, 768), (512, 768)),        # within bounds: as uploaded
])
def test_without_size_the_uploads_size_is_brought_within_the_web_uis_bounds(server, sd, upload, expected):
    resp = openai_client(server).images.create_variation(image=("v.png", black_png(*upload), "image/png"),
                                                         response_format="b64_json")
    assert png_size(resp.data[0].b64_json) == expected
    req = sd.requests[-1][1]
    assert (req["width"], req["height"]) == expected
    assert Image.open(io.BytesIO(base64.b64decode(req["init_images"][0]))).size == upload


def test_size_auto_on_an_edit_also_fits_the_upload(server, sd):
    r = post_form(server, "edits", {"image": ("in.png", black_png(4096, 4096), "image/png")},
                  {"prompt": "p", "size": "auto", "response_format": "b64_json"})
    assert r.status_code == 200, r.text
    assert (sd.requests[-1][1]["width"], sd.requests[-1][1]["height"]) == (2048, 2048)


def test_mask_of_another_size_is_a_400_and_palette_transparency_is_a_mask(server, sd):
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.images.edit(image=("x.png", png(64, 64), "image/png"), prompt="p",
                           mask=("m.png", png(128, 64, "RGBA"), "image/png"))
    assert e.value.body["param"] == "mask" and "128x64" in e.value.body["message"]
    assert "same size" in e.value.body["message"] and sd.requests == []
    palette = Image.new("P", (64, 64), 1)
    palette.putpalette([0, 0, 0, 255, 255, 255])
    palette.paste(0, (0, 0, 32, 64))                 # index 0 is transparent: the left half
    out = io.BytesIO()
    palette.save(out, format="PNG", transparency=0)
    client.images.edit(image=("x.png", png(64, 64), "image/png"), prompt="p", mask=("m.png", out.getvalue(), "image/png"))
    sd_mask = Image.open(io.BytesIO(base64.b64decode(sd.requests[-1][1]["mask"])))
    assert sd_mask.getpixel((10, 10)) == 255 and sd_mask.getpixel((50, 10)) == 0


def test_other_formats_and_truncated_images_are_400s(server, sd):
    gif = io.BytesIO()
    Image.new("RGB", (64, 64)).save(gif, format="GIF")
    r = post_form(server, "variations", {"image": ("x.gif", gif.getvalue(), "image/gif")})
    assert_400(r, "image", "x.gif", "PNG")
    truncated = png(256, 256, "RGB", (1, 2, 3))[:-40]
    r = post_form(server, "variations", {"image": ("t.png", truncated, "image/png")})
    assert_400(r, "image", "t.png")
    assert sd.requests == []


def test_decoding_uploads_runs_off_the_event_loop(server, sd, monkeypatch):
    started, release = threading.Event(), threading.Event()
    prepare = images_module.prepare_images

    def slow_prepare(*args):
        started.set()
        release.wait(10)        # on the event loop this would stall every other request
        return prepare(*args)

    monkeypatch.setattr(images_module, "prepare_images", slow_prepare)
    result = {}
    edit = threading.Thread(target=lambda: result.update(r=post_form(
        server, "edits", {"image": ("in.png", png(64, 64), "image/png")}, {"prompt": "p"})))
    edit.start()
    try:
        assert started.wait(10)
        other = httpx.post(f"{server.url}/images/generations", json={"prompt": "x", "size": "1x1"}, timeout=3)
        assert other.status_code == 400 and not result     # answered while the edit is still decoding
    finally:
        release.set()
        edit.join(30)
    assert result["r"].status_code == 200


def test_edits_take_openais_json_body_with_images_as_data_urls(server, sd):
    """The JSON form of /images/edits (images as references) works as the multipart one does."""
    data_url = "data:image/png;base64," + base64.b64encode(png(128, 96)).decode()
    mask = Image.new("RGBA", (128, 96), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (0, 0, 64, 96))
    buf = io.BytesIO()
    mask.save(buf, format="PNG")
    mask_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    r = httpx.post(server.url + "/images/edits", timeout=60, json={
        "model": "gpt-image-1", "prompt": "add a red door", "images": [{"image_url": data_url}],
        "mask": {"image_url": mask_url}, "n": 2, "size": "256x256"})
    assert r.status_code == 200, r.text
    assert_valid("ImagesResponse", r.json())
    assert len(r.json()["data"]) == 2 and png_size(r.json()["data"][0]["b64_json"]) == (256, 256)
    path, req = sd.requests[-1]
    assert path == "/sdapi/v1/img2img" and req["prompt"] == "add a red door" and req["batch_size"] == 2
    assert "mask" in req and len(req["init_images"]) == 1


@pytest.mark.parametrize("body, param, says", [
    ({"prompt": "p", "images": [{"image_url": "https://example.com/a.png"}]}, "images", "does not fetch"),
    ({"prompt": "p", "images": [{"file_id": "file-abc"}]}, "images", "Files API"),
    ({"prompt": "p", "images": [{"image_url": "data:image/png;base64,@@@"}]}, "images", "base64"),
    ({"prompt": "p"}, "images", "Missing"),
    ({"images": [{"image_url": "data:image/png;base64,AAAA"}]}, "prompt", "prompt"),
])
def test_json_edit_errors_name_the_field(server, body, param, says):
    r = httpx.post(server.url + "/images/edits", json=body, timeout=30)
    assert_400(r, param, says)
