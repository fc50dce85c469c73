"""Responses input_image parts in extension mode: they reach a vision model loaded in the web UI
through chat's own code (<__media__> placeholders, PIL images in the state's raw_images), are
stored with their items so a previous_response_id chain still shows them (bounded in size), and
without vision get a 400 naming the part (input[i].content[j])."""

from __future__ import annotations

import base64
import io
import random

import httpx
import openai
import pytest
from PIL import Image
from support.responses_api import create
from support.servers import free_port
from support.spec import assert_valid, error_of
from support.vision import data_url, load_vision_model
from support.webui import load_extension

from openai_ext.responses import images as stored_images


@pytest.fixture
def ext(host_modules, tmp_path, stop_later):
    host_modules.shared.settings["openai_ext-port"] = free_port()
    host_modules.shared.settings["openai_ext-data_dir"] = str(tmp_path)
    loaded = load_extension(host_modules.shared)
    yield loaded
    stop_later(loaded.server)


@pytest.fixture
def client(ext):
    return openai.OpenAI(base_url=ext.server.url, api_key="x", max_retries=0, _strict_response_validation=True,
                         timeout=30)


def image(url, **kw):
    return {"type": "input_image", "image_url": url, **kw}


def ask(*parts):
    return [{"role": "user", "content": list(parts)}]


def pixels(host_modules):
    return [i.getpixel((0, 0)) for i in host_modules.text_generation.CALLS[-1][1]["raw_images"]]


def test_images_reach_the_model_and_stay_in_the_chain(client, host_modules):
    load_vision_model(host_modules)
    first, _ = create(client, input=ask({"type": "input_text", "text": "What is this?"},
                                        image(data_url("red"), detail="low")))
    assert first.output_text == "Hello, world!"
    question = host_modules.text_generation.CALLS[-1][0]
    assert "<|im_start|>user\n<__media__>\n\nWhat is this?<|im_end|>" in question
    assert pixels(host_modules) == [(255, 0, 0)]
    # the stored input keeps the part, in OpenAI's listed shape
    raw = client.responses.input_items.with_raw_response.list(first.id)
    assert_valid("ResponseItemList", raw.http_response.json())
    assert raw.http_response.json()["data"][0]["content"][1] == {"type": "input_image", "image_url": data_url("red"),
                                                                 "file_id": None, "detail": "low"}
    # a later turn still shows the model the first turn's image, then its own
    create(client, previous_response_id=first.id, input=ask(image(data_url("lime")),
                                                            {"type": "input_text", "text": "And this?"}))
    assert pixels(host_modules) == [(255, 0, 0), (0, 255, 0)]
    assert host_modules.text_generation.CALLS[-1][0].count("<__media__>") == 2


def test_images_in_a_function_output_reach_the_model(client, host_modules):
    load_vision_model(host_modules)
    tool = {"type": "function", "name": "look", "parameters": {"type": "object", "properties": {}}}
    create(client, tools=[tool], input=[
        {"role": "user", "content": "Look."},
        {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": [image(data_url("blue"))]}])
    assert pixels(host_modules) == [(0, 0, 255)]


def test_a_large_image_is_kept_bounded(client, host_modules):
    load_vision_model(host_modules)
    noise = Image.frombytes("RGB", (1700, 1000), random.Random(0).randbytes(1700 * 1000 * 3))
    buffered = io.BytesIO()
    noise.save(buffered, format="PNG")
    big = "data:image/png;base64," + base64.b64encode(buffered.getvalue()).decode()
    assert len(big) > stored_images.STORED_CHARS
    first, _ = create(client, input=ask(image(big)))
    kept = client.responses.input_items.list(first.id).data[0].content[0].image_url
    assert kept.startswith("data:image/jpeg;base64,") and len(kept) <= stored_images.STORED_CHARS
    # the model saw the image that was kept (scaled to 1568 pixels on its longer side)
    assert host_modules.text_generation.CALLS[-1][1]["raw_images"][0].size == (1568, 922)


def error(ext, body, status=400):
    return error_of(httpx.post(f"{ext.server.url}/responses", json={"model": "x", **body}, timeout=30), status)


def test_a_model_without_vision_names_the_part(ext, host_modules):
    assert not host_modules.shared.is_multimodal
    err = error(ext, {"instructions": "Be brief.", "input": [
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": [{"type": "input_text", "text": "x"}, image(data_url("red"))]}]})
    assert err["param"] == "input[1].content[1].type"
    assert err["message"].startswith("input[1].content[1] is an image, and the loaded model has no vision")
    assert "--mmproj" in err["message"] and host_modules.text_generation.CALLS == []


def test_a_chain_with_images_after_the_vision_model_is_gone(ext, client, host_modules):
    load_vision_model(host_modules)
    first, _ = create(client, input=ask(image(data_url("red"))))
    referenced = client.responses.input_items.list(first.id).data[0].id
    host_modules.shared.args.mmproj = None   # a text model loaded instead
    shared = host_modules.shared
    shared.model, shared.tokenizer = host_modules.models.load_model(shared.model_name, "llama.cpp")
    err = error(ext, {"previous_response_id": first.id, "input": "And now?"})
    assert err["param"] == "previous_response_id" and "holds an image" in err["message"]
    err = error(ext, {"input": [{"type": "item_reference", "id": referenced}]})
    assert err["param"] == "input[0].id" and "holds an image" in err["message"]


@pytest.mark.parametrize("part, param, says", [
    (image("https://example.com/cat.png"), "input[0].content[0].image_url", "fetches no URL"),
    (image("data:image/png;base64,bm90IGFuIGltYWdl"), "input[0].content[0].image_url", "could not be read"),
    ({"type": "input_image", "file_id": "file-1", "detail": "auto"}, "input[0].content[0].file_id", "not read from the Files API"),
    (image(None), "input[0].content[0].image_url", "must be the image as a data URL"),
    (image(data_url("red"), detail="sharp"), "input[0].content[0].detail", "must be one of auto, low"),
])
def test_images_it_cannot_read_are_a_400_naming_the_part(ext, host_modules, part, param, says):
    load_vision_model(host_modules)
    err = error(ext, {"input": ask(part)})
    assert err["param"] == param and says in err["message"], err
