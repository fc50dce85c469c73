"""POST /v1/responses through the official SDK: the Response object, exact usage, instructions,
input items and log-probabilities on the scripted host; a real answer and structured output on
the real SmolLM2 model."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import BaseModel
from support.responses_api import create
from support.spec import assert_valid

Q = "Name three colours of the rainbow."


def prompt_tokens(host, messages):
    return len(host.tokenize(host.chat_prompt(messages).text))


def test_a_response_is_real_and_conformant(rclient, llama_host):
    resp, body = create(rclient, input=Q, max_output_tokens=24, metadata={"topic": "colours"})
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.model == llama_host.model_id
    assert resp.status == "completed" or (resp.status == "incomplete"
                                          and resp.incomplete_details.reason == "max_output_tokens")
    [message] = resp.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert resp.output_text == message.content[0].text and resp.output_text.strip()
    # the request's fields are echoed, with OpenAI's defaults filled in
    assert body["metadata"] == {"topic": "colours"} and body["store"] is True and body["background"] is False
    assert body["temperature"] == 0 and body["top_p"] == 1 and body["tool_choice"] == "auto"
    assert body["text"] == {"format": {"type": "text"}, "verbosity": "medium"} and body["truncation"] == "disabled"
    # exact usage, from the model's own tokenizer
    usage = resp.usage
    assert usage.input_tokens == prompt_tokens(llama_host, [{"role": "user", "content": Q}])
    assert usage.output_tokens == len(llama_host.tokenize(resp.output_text, add_bos=False)) or usage.output_tokens == 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_max_output_tokens_gives_an_incomplete_response(srclient):
    resp, body = create(srclient, input="Write a long story about a dragon.", max_output_tokens=16)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 16
    assert body["output"][0]["status"] == "incomplete" and body["completed_at"] is None


def test_a_natural_end_is_completed(srclient):
    resp, body = create(srclient, input="Say hi.", max_output_tokens=200)
    assert resp.status == "completed" and resp.incomplete_details is None
    assert resp.usage.output_tokens < 200 and body["completed_at"] >= body["created_at"]


def test_instructions_and_every_input_shape_reach_the_prompt(srclient, scripted_host):
    items = [
        {"role": "developer", "content": "DEV-RULE"},
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "SYS-RULE"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "part one"}, {"type": "input_text", "text": "part two"}]},
        {"role": "assistant", "content": "EARLIER-ANSWER"},
        {"role": "user", "content": "And now?"},
    ]
    resp, _ = create(srclient, instructions="BE-BRIEF", input=items, max_output_tokens=16)
    expected = [{"role": "system", "content": "BE-BRIEF"}, {"role": "developer", "content": "DEV-RULE"},
                {"role": "system", "content": "SYS-RULE"}, {"role": "user", "content": "part one\npart two"},
                {"role": "assistant", "content": "EARLIER-ANSWER"}, {"role": "user", "content": "And now?"}]
    from openai_ext.text.chat import normalize_messages
    from openai_ext.text.protocol import ChatCompletionRequest

    messages = normalize_messages(ChatCompletionRequest(messages=expected))
    assert resp.usage.input_tokens == prompt_tokens(scripted_host, messages)
    text = scripted_host.chat_prompt(messages).text
    assert all(marker in text for marker in ("BE-BRIEF", "DEV-RULE", "SYS-RULE", "part one\npart two", "EARLIER-ANSWER"))


def test_streamed_and_plain_text_agree_and_input_tokens_counts_the_same(srserver, srclient):
    from support.responses_api import stream_raw

    resp, _ = create(srclient, input=Q, max_output_tokens=30, instructions="Answer in one line.")
    events = stream_raw(srserver, {"input": Q, "max_output_tokens": 30, "instructions": "Answer in one line."})
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == resp.output_text
    assert events[-1]["response"]["usage"] == resp.usage.model_dump(exclude_none=True)
    counted = srclient.responses.input_tokens.count(model="x", input=Q, instructions="Answer in one line.")
    assert counted.input_tokens == resp.usage.input_tokens
    r = httpx.post(f"{srserver.url}/responses/input_tokens", json={"input": Q}, timeout=60)
    assert_valid("TokenCountsResource", r.json())


def test_logprobs_with_include(srclient):
    resp, body = create(srclient, input=Q, max_output_tokens=16, top_logprobs=2,
                        include=["message.output_text.logprobs"])
    part = body["output"][0]["content"][0]
    assert len(part["logprobs"]) == resp.usage.output_tokens
    assert "".join(lp["token"] for lp in part["logprobs"]) == part["text"]
    assert all(len(lp["top_logprobs"]) == 2 and lp["logprob"] <= 0 for lp in part["logprobs"])


def test_parse_with_a_pydantic_model(rclient):
    class City(BaseModel):
        name: str
        country: str
        population: int

    raw = rclient.responses.with_raw_response.parse(model="gpt-4o", input="Describe Paris.", text_format=City,
                                                    temperature=0, max_output_tokens=200)
    body = raw.http_response.json()
    assert_valid("Response", body)
    assert body["text"]["format"]["type"] == "json_schema" and body["text"]["format"]["strict"] is True
    resp = raw.parse()
    assert resp.status == "completed"
    assert isinstance(resp.output_parsed, City)


@pytest.mark.parametrize("fmt", [{"type": "json_object"},
                                 {"type": "json_schema", "name": "fruits", "strict": True,
                                  "schema": {"type": "object", "properties": {"fruits": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
                                             "required": ["fruits"], "additionalProperties": False}}])
def test_text_format_is_enforced(rclient, fmt):
    resp, body = create(rclient, input="List two fruits as JSON.", max_output_tokens=200, text={"format": fmt})
    # echoed as sent, with a json_schema format's description "" when none was sent (Open Responses needs the key,
    # OpenAI's spec a string)
    echoed = {"description": "", **fmt} if fmt["type"] == "json_schema" else fmt
    assert resp.status == "completed" and body["text"]["format"] == echoed
    value = json.loads(resp.output_text)
    assert isinstance(value, dict)
    if fmt["type"] == "json_schema":
        assert set(value) == {"fruits"}


def test_reasoning_is_accepted_and_echoed_without_reasoning_items(srclient):
    resp, body = create(srclient, input="Say hi.", max_output_tokens=16, reasoning={"effort": "low"},
                        text={"verbosity": "low"})
    assert body["reasoning"] == {"effort": "low", "summary": None}
    assert [item.type for item in resp.output] == ["message"]
    assert resp.usage.output_tokens_details.reasoning_tokens == 0


def test_host_samplers_pass_through(srserver):
    r = httpx.post(f"{srserver.url}/responses", timeout=60,
                   json={"input": "Say hi.", "max_output_tokens": 16, "top_k": 20, "mode": "instruct"})
    assert r.status_code == 200, r.text
    assert_valid("Response", r.json())
