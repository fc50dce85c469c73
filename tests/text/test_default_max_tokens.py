"""The default_max_tokens setting: a cap for clients that never send max_tokens (coding agents,
shell tools), where OpenAI's rule would let a small model write to the end of the context."""

from __future__ import annotations

import pytest
from support.servers import openai_client
from support.spec import assert_valid


@pytest.fixture(scope="module")
def capped(scripted_host, make_server):
    return openai_client(make_server(scripted_host, default_max_tokens=8))


def test_a_chat_without_max_tokens_stops_at_the_cap(capped):
    raw = capped.chat.completions.with_raw_response.create(
        model="x", messages=[{"role": "user", "content": "Write a long story."}], extra_body={"ban_eos_token": True})
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    reply = raw.parse()
    assert reply.usage.completion_tokens == 8 and reply.choices[0].finish_reason == "length"


def test_a_max_tokens_the_client_sends_is_kept(capped):
    reply = capped.chat.completions.create(model="x", max_tokens=20, messages=[{"role": "user", "content": "Hi"}],
                                           extra_body={"ban_eos_token": True})
    assert reply.usage.completion_tokens == 20


def test_a_response_without_max_output_tokens_stops_at_the_cap(capped):
    raw = capped.responses.with_raw_response.create(model="x", input="Write a long story.", store=False,
                                                     extra_body={"ban_eos_token": True})
    assert_valid("Response", raw.http_response.json())
    response = raw.parse()
    assert response.usage.output_tokens == 8 and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


def test_completions_keep_openais_default_of_16(capped):
    reply = capped.completions.create(model="x", prompt="Once upon a time", extra_body={"ban_eos_token": True})
    assert reply.usage.completion_tokens == 16
