"""Images in standalone mode: the embedded llama.cpp host with a projector (hosts/llamacpp/vision.py),
through every API that takes images: chat's image_url, Messages' image blocks, Responses'
input_image and Realtime's input_image parts.

No small vision GGUF can be had here (no package carries one, and no machine here reaches the
hub), so the projector is the smallest one llama.cpp's libmtmd accepts for the embedded SmolLM2,
made by the tests with random weights (support/tiny_mmproj.py). What runs for real: the
projector loaded by libmtmd, the prompt split into text and image chunks, each image encoded and
its embeddings decoded into the sequence's cells inside the running batch, image tokens counted
in usage and in the context check, and the cells of an image reused only for the same image.
What it cannot show: that a real model describes a picture well (its answers here are
about noise)."""

from __future__ import annotations

import threading

import pytest
from support.anthropic_types import anthropic_client
from support.servers import openai_client
from support.spec import assert_valid
from support.tiny_mmproj import build
from support.vision import data_url, encoded

from openai_ext.hosts.files import default_gguf
from openai_ext.hosts.llamacpp import LlamaCppHost

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def seeing(tmp_path_factory):
    mmproj = build(tmp_path_factory.mktemp("vision") / "mmproj-SmolLM2-135M-Instruct-f16.gguf")
    host = LlamaCppHost(default_gguf(), n_ctx=512, parallel=2, mmproj=mmproj)
    yield host
    host.close()


@pytest.fixture(scope="module")
def served(seeing, make_server):
    return make_server(seeing)


def image_tokens(host) -> int:
    return sum(1 for t in host.prompt_tokens("<__media__>", [_image("red")]) if t < 0)


def _image(color):
    import base64
    import io

    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(encoded(color, size=(48, 40)))))


def ask(client, color=None, text="What is in the picture?", **kw):
    content = [{"type": "text", "text": text}]
    if color is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": data_url(color, size=(48, 40))}})
    reply = client.chat.completions.with_raw_response.create(
        model="x", max_tokens=8, temperature=0, messages=[{"role": "user", "content": content}], **kw)
    body = reply.http_response.json()
    assert_valid("CreateChatCompletionResponse", body)
    return reply.parse()


def test_the_host_says_it_sees_and_counts_an_image_as_its_tokens(seeing, served):
    n = image_tokens(seeing)
    assert n > 0 and seeing.abilities.vision and seeing.describe()["mmproj"].startswith("mmproj-")
    client = openai_client(served)
    with_image, without = ask(client, "red"), ask(client)
    assert with_image.usage.completion_tokens > 0
    # the image's tokens (and the line break after its placeholder), not the placeholder's text
    assert n <= with_image.usage.prompt_tokens - without.usage.prompt_tokens <= n + 2


def test_the_same_image_gives_the_same_answer_and_another_image_another(served):
    client = openai_client(served)
    first = ask(client, "red", logprobs=True, top_logprobs=3)
    again = ask(client, "red", logprobs=True, top_logprobs=3)   # its cells are reused from the first
    other = ask(client, "blue", logprobs=True, top_logprobs=3)
    assert first.choices[0].message.content == again.choices[0].message.content
    lp = [t.logprob for t in first.choices[0].logprobs.content]
    assert lp == pytest.approx([t.logprob for t in again.choices[0].logprobs.content], abs=1e-3)
    assert lp[0] != pytest.approx(other.choices[0].logprobs.content[0].logprob, abs=1e-6)


def test_images_beside_text_streams_in_one_batch(served):
    client = openai_client(served, timeout=300)
    results: dict[int, str] = {}

    def run(i: int) -> None:
        if i == 2:
            reply = client.chat.completions.create(model="x", max_tokens=16, temperature=0,
                                                   messages=[{"role": "user", "content": "Tell me a story."}],
                                                   extra_body={"ban_eos_token": True})
            results[i] = reply.choices[0].finish_reason
        else:
            results[i] = ask(client, ("green", "yellow")[i]).choices[0].finish_reason

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(results) == [0, 1, 2] and results[2] == "length"


def test_an_image_that_does_not_fit_the_context_is_a_400_that_says_so(served, seeing):
    client = openai_client(served)
    n = image_tokens(seeing)
    many = 512 // n + 1
    content = [{"type": "image_url", "image_url": {"url": data_url(c, size=(48, 40))}}
               for c in [(i, 0, 0) for i in range(many)]] + [{"type": "text", "text": "Compare them."}]
    with pytest.raises(Exception) as e:
        client.chat.completions.create(model="x", max_tokens=8, messages=[{"role": "user", "content": content}])
    error = e.value.body
    assert e.value.status_code == 400 and error["code"] == "context_length_exceeded"
    assert f"{many} image(s) included" in error["message"]


def test_messages_image_blocks(served, seeing):
    client = anthropic_client(served)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": encoded("red", size=(48, 40))}}
    seen = client.messages.create(model="x", max_tokens=8, messages=[
        {"role": "user", "content": [block, {"type": "text", "text": "What is in the picture?"}]}])
    plain = client.messages.create(model="x", max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is in the picture?"}]}])
    assert seen.usage.output_tokens > 0
    assert image_tokens(seeing) <= seen.usage.input_tokens - plain.usage.input_tokens <= image_tokens(seeing) + 2
    counted = client.messages.count_tokens(model="x", messages=[
        {"role": "user", "content": [block, {"type": "text", "text": "What is in the picture?"}]}])
    assert counted.input_tokens == seen.usage.input_tokens


def test_responses_input_image(served, seeing):
    client = openai_client(served)
    message = {"role": "user", "content": [{"type": "input_image", "image_url": data_url("red", size=(48, 40))},
                                           {"type": "input_text", "text": "What is in the picture?"}]}
    response = client.responses.create(model="x", input=[message], max_output_tokens=16, temperature=0)
    assert response.status in ("completed", "incomplete") and response.usage.input_tokens > image_tokens(seeing)
    counted = client.responses.input_tokens.count(model="x", input=[message])
    assert counted.input_tokens == response.usage.input_tokens


def test_realtime_input_image(served, seeing):
    client = openai_client(served)
    with client.realtime.connect(model="gpt-realtime") as connection:
        assert connection.recv().type == "session.created"
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "max_output_tokens": 8})
        connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": data_url("red", size=(48, 40))},
            {"type": "input_text", "text": "What is in the picture?"}]})
        connection.response.create()
        done = next(e for e in connection if e.type in ("response.done", "error"))
        assert done.type == "response.done", done
        assert done.response.status in ("completed", "incomplete")   # (8 tokens at most)
        assert done.response.usage.input_tokens > image_tokens(seeing)


def test_a_projector_for_another_model_is_refused_at_load_saying_so(tmp_path):
    wrong = build(tmp_path / "mmproj-wide.gguf", n_embd=64)   # SmolLM2's width is 576
    with pytest.raises(ValueError, match="mmproj-wide.gguf is not a projector llama.cpp can load for this model"):
        LlamaCppHost(default_gguf(), n_ctx=256, mmproj=wrong)
