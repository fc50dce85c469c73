"""Messages image blocks in extension mode: a base64 source reaches a vision model loaded in the
web UI through chat's own code (<__media__> placeholders in the prompt, PIL images in the state's
raw_images); without vision, and for what the server cannot read, a 400 names the block as the
client sent it (messages[i].content[j]), not its place in the chat request."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from support.anthropic_types import anthropic_client, assert_error, assert_message
from support.vision import encoded, load_vision_model


@pytest.fixture
def claude(extension):
    return anthropic_client(extension.server)


def image(data, media_type="image/png"):
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def test_image_blocks_reach_the_vision_model(claude, host_modules):
    load_vision_model(host_modules)
    raw = claude.messages.with_raw_response.create(model="x", max_tokens=50, system="Be brief.", messages=[
        {"role": "user", "content": [image(encoded("red")), {"type": "text", "text": "What is this?"},
                                     image(encoded("blue", fmt="JPEG"), "image/jpeg")]}])
    assert_message(raw.http_response.json())
    assert raw.parse().content[0].text == "Hello, world!"
    question, state, _, _ = host_modules.text_generation.CALLS[-1]
    assert "<|im_start|>user\n<__media__><__media__>\n\nWhat is this?<|im_end|>" in question
    red, blue = state["raw_images"]   # (the JPEG one lossy)
    assert red.getpixel((0, 0)) == (255, 0, 0) and blue.getpixel((0, 0))[2] > 250 and blue.size == (4, 3)
    sent = host_modules.shared.model.last_multimodal   # what the loader sent llama-server
    assert sent["prompt_string"].count("<__media_marker__>") == 2 and len(sent["multimodal_data"]) == 2


def test_images_of_a_tool_result_and_later_turns_keep_their_order(claude, host_modules):
    load_vision_model(host_modules)
    tool = {"name": "look", "description": "Looks.", "input_schema": {"type": "object", "properties": {}}}
    claude.messages.create(model="x", max_tokens=50, tools=[tool], messages=[
        {"role": "user", "content": [{"type": "text", "text": "Look."}, image(encoded("red"))]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image(encoded("lime"))]},
            {"type": "text", "text": "And this?"}, image(encoded("blue"))]}])
    state = host_modules.text_generation.CALLS[-1][1]
    assert [i.getpixel((0, 0)) for i in state["raw_images"]] == [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    # count_tokens renders the same prompt, placeholders included
    assert claude.messages.count_tokens(model="x", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Look."}, image(encoded("red"))]}]).input_tokens > 0


def error(extension, messages, **kw):
    r = httpx.post(f"{extension.server.url}/messages", timeout=30,
                   json={"model": "x", "max_tokens": 20, "messages": messages, **kw})
    assert r.status_code == 400, r.text
    assert_error(r.json(), "invalid_request_error")
    return r.json()["error"]["message"]


def test_a_model_without_vision_names_the_block(extension, claude, host_modules):
    assert not host_modules.shared.is_multimodal
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": [{"type": "text", "text": "x"}, image(encoded("red"))]}]
    said = error(extension, messages, system="Be brief.")
    # the chat request has the system message first: its part is messages[3].content[1]
    assert said.startswith("messages[2].content[1] is an image, and the loaded model has no vision") and "--mmproj" in said
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.count_tokens(model="x", messages=messages)
    assert "messages[2].content[1] is an image" in e.value.body["error"]["message"]
    assert host_modules.text_generation.CALLS == []


@pytest.mark.parametrize("source, says", [
    ({"type": "url", "url": "https://example.com/cat.png"},
     "messages[0].content[1].source.url is an http URL; this server fetches no URL. Send the image itself as a "
     "base64 source."),
    ({"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"},
     "messages[0].content[1].source.data could not be read as an image"),
    ({"type": "base64", "media_type": "image/tiff", "data": "AAAA"},
     "messages[0].content[1].source.media_type must be one of image/jpeg, image/png, image/gif, image/webp"),
    ({"type": "file", "file_id": "file_1"}, "messages[0].content[1].source is a file source (Anthropic's Files API), "
                                            "which this server does not read"),
    ({"type": "text", "data": "x"}, "messages[0].content[1].source.type must be base64"),
])
def test_images_it_cannot_read_name_the_block(extension, host_modules, source, says):
    load_vision_model(host_modules)
    said = error(extension, [{"role": "user", "content": [{"type": "text", "text": "x"},
                                                          {"type": "image", "source": source}]}], system="s")
    assert said.startswith(says), said


def test_an_image_in_an_assistant_turn_is_refused(extension, host_modules):
    load_vision_model(host_modules)
    said = error(extension, [{"role": "user", "content": "x"},
                             {"role": "assistant", "content": [image(encoded("red"))]}, {"role": "user", "content": "y"}])
    assert said == "messages[1].content[0] is a block of type 'image', which belongs in a user turn (or a tool_result)."
