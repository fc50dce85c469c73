"""Image parts for a vision model loaded in the web UI (llama.cpp with --mmproj): they reach its
loader as the web UI's own API passes them, <__media__> placeholders in the prompt and PIL images
in the state's raw_images; a model without vision refuses them with a 400 naming the part."""

from __future__ import annotations

import openai
import pytest
from support.spec import assert_valid
from support.vision import data_url, load_vision_model


@pytest.fixture
def client(extension):
    return openai.OpenAI(base_url=extension.server.url, api_key="x", max_retries=0,
                         _strict_response_validation=True, timeout=30)


def image(url):
    return {"type": "image_url", "image_url": {"url": url}}


def test_images_reach_the_vision_model_as_the_web_uis_api_passes_them(client, host_modules):
    load_vision_model(host_modules)
    red, blue = data_url("red"), data_url("blue", fmt="JPEG")
    raw = client.chat.completions.with_raw_response.create(model="x", messages=[
        {"role": "user", "content": [{"type": "text", "text": "What differs?"}, image(red), image(blue)]}])
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    assert raw.parse().choices[0].message.content == "Hello, world!"
    question, state, _, _ = host_modules.text_generation.CALLS[-1]
    # the placeholders first, then the text (the web UI API's process_multimodal_content)
    assert "<|im_start|>user\n<__media__><__media__>\n\nWhat differs?<|im_end|>" in question
    assert [i.getpixel((0, 0))[:3] for i in state["raw_images"]][0] == (255, 0, 0)
    assert [i.size for i in state["raw_images"]] == [(4, 3), (4, 3)]
    sent = host_modules.shared.model.last_multimodal   # what the loader sent llama-server
    assert sent["prompt_string"].count("<__media_marker__>") == 2 and len(sent["multimodal_data"]) == 2


def test_images_of_several_messages_keep_their_order(client, host_modules):
    load_vision_model(host_modules)
    client.chat.completions.create(model="x", messages=[
        {"role": "user", "content": [image(data_url("red")), {"type": "text", "text": "one"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [image(data_url("lime")), {"type": "text", "text": "two"}]}])
    state = host_modules.text_generation.CALLS[-1][1]
    assert [i.getpixel((0, 0)) for i in state["raw_images"]] == [(255, 0, 0), (0, 255, 0)]


def test_a_model_without_vision_refuses_the_part_by_name(client, host_modules):
    assert not host_modules.shared.is_multimodal
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[
            {"role": "user", "content": [{"type": "text", "text": "x"}, image(data_url("red"))]}])
    assert e.value.body["param"] == "messages[0].content[1].type"
    assert "no vision" in e.value.body["message"] and "--mmproj" in e.value.body["message"]
    assert host_modules.text_generation.CALLS == []


@pytest.mark.parametrize("url, says", [
    ("https://example.com/cat.png", "fetches no URL"),
    ("data:image/png;base64,bm90IGFuIGltYWdl", "could not be read as an image"),
    ("data:text/plain;base64,aGk=", "not a base64 data URL of an image"),
])
def test_images_it_cannot_read_are_a_400_naming_the_part(client, host_modules, url, says):
    load_vision_model(host_modules)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": [image(url)]}])
    assert e.value.body["param"] == "messages[0].content[0].image_url.url" and says in e.value.body["message"]
