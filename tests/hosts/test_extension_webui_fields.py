"""The web UI API's own request fields, mapped as its API maps them (this project's extensions to
OpenAI's schema): chat modes, characters, instruction templates, presets, extra samplers and
reasoning switches; and the model's thinking returned apart from its answer."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.spec import assert_valid, assert_valid_stream

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def post(extension):
    def post(path: str, **body):
        return httpx.post(f"{extension.server.url}{path}", json={"model": "x", **body}, timeout=30)
    return post


def last_prompt(host_modules):
    return host_modules.text_generation.CALLS[-1][0]


def last_state(host_modules):
    return host_modules.text_generation.CALLS[-1][1]


# --- chat modes and characters -------------------------------------------------------------------

def test_chat_mode_with_a_character_and_its_stop_strings(post, host_modules):
    host_modules.text_generation.SCRIPT = ["Arr, matey.", "\nYou:", " more"]
    r = post("/chat/completions", messages=HI, mode="chat", character="Pirate")
    assert r.status_code == 200, r.text
    assert_valid("CreateChatCompletionResponse", r.json())
    prompt = last_prompt(host_modules)
    assert prompt.startswith("Captain Flint is a pirate") and prompt.endswith("You: Hi\nCaptain Flint:")
    # the chat template's own stop strings (the next "\nYou:") end the reply
    assert r.json()["choices"][0]["message"]["content"] == "Arr, matey."
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_names_context_and_bio_override_the_character(post, host_modules):
    r = post("/chat/completions", messages=HI, mode="chat", character="Pirate", user_name="Ann", bot_name="Bo",
             context="Bo is terse.", user_bio="Ann likes tea.")
    assert r.status_code == 200, r.text
    prompt = last_prompt(host_modules)
    assert prompt.startswith("Bo is terse.\n\nAnn likes tea.") and prompt.endswith("Ann: Hi\nBo:")
    r = post("/chat/completions", messages=HI, mode="chat", name1="Cy", name2="Di")
    assert last_prompt(host_modules).endswith("Cy: Hi\nDi:")   # the web UI's default character, renamed


def test_chat_instruct_wraps_the_chat_in_the_instruction_template(post, host_modules):
    r = post("/chat/completions", messages=HI, mode="chat-instruct", character="Pirate",
             chat_instruct_command="Reply as <|character|>:\n<|prompt|>")
    assert r.status_code == 200, r.text
    prompt = last_prompt(host_modules)
    assert prompt.startswith("<|im_start|>user\nReply as Captain Flint:\nCaptain Flint is a pirate")
    assert prompt.endswith("<|im_start|>assistant\nCaptain Flint:")


def test_instruction_templates_by_name_or_inline(post, host_modules):
    r = post("/chat/completions", messages=HI, instruction_template="Alpaca")
    assert r.status_code == 200 and last_prompt(host_modules) == "### Instruction:\nHi\n\n### Response:\n"
    inline = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"
    r = post("/chat/completions", messages=HI, instruction_template_str=inline, instruction_template="Alpaca")
    assert r.status_code == 200 and last_prompt(host_modules) == "[user] Hi\n[assistant]"   # inline wins


@pytest.mark.parametrize("field, value", [("character", "Nobody"), ("instruction_template", "../../etc/passwd"),
                                          ("preset", "Nope"), ("mode", "story")])
def test_names_the_web_ui_does_not_have_are_refused_by_field(post, field, value):
    r = post("/chat/completions", messages=HI, **{field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_continue_extends_the_last_assistant_message(post, host_modules):
    r = post("/chat/completions", continue_=True,
             messages=[*HI, {"role": "assistant", "content": "Once upon a"}])
    assert r.status_code == 200, r.text
    assert last_prompt(host_modules).endswith("<|im_start|>assistant\nOnce upon a")


def test_template_fields_are_chat_fields(post):
    r = post("/completions", prompt="x", mode="chat")
    assert r.status_code == 400 and r.json()["error"]["param"] == "mode"
    assert "chat/completions" in r.json()["error"]["message"]


# --- presets and samplers ----------------------------------------------------------------------------

def test_a_preset_sets_the_samplers_and_the_request_overrides_them(post, host_modules):
    r = post("/chat/completions", messages=HI, preset="Creative")
    assert r.status_code == 200, r.text
    state = last_state(host_modules)
    assert (state["temperature"], state["top_p"], state["min_p"]) == (1.3, 0.98, 0.05)
    r = post("/completions", prompt="x", preset="Creative", temperature=0.2, max_tokens=2)
    assert r.status_code == 200, r.text
    state = last_state(host_modules)
    assert (state["temperature"], state["min_p"]) == (0.2, 0.05)
    r = post("/chat/completions", messages=HI)   # no preset: OpenAI's defaults
    assert (last_state(host_modules)["temperature"], last_state(host_modules)["top_p"]) == (1.0, 1.0)


def test_the_web_uis_extra_samplers(post, host_modules):
    r = post("/chat/completions", messages=HI, sampler_priority=["top_k", "temperature"],
             dry_sequence_breakers='"\\n", ":"', max_tokens_second=5)
    assert r.status_code == 200, r.text
    state = last_state(host_modules)
    assert state["sampler_priority"] == "top_k\ntemperature" and state["dry_sequence_breakers"] == '"\\n", ":"'
    assert state["max_tokens_second"] == 5
    r = post("/chat/completions", messages=HI, prompt_lookup_num_tokens=3)   # a Transformers sampler
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_lookup_num_tokens"


# --- reasoning ---------------------------------------------------------------------------------------

def test_reasoning_switches_reach_the_chat_template(post, host_modules):
    chat = host_modules.chat
    post("/chat/completions", messages=HI, enable_thinking=False, reasoning_effort="high")
    state = chat.CALLS[-1][1]
    assert state["enable_thinking"] is False and state["reasoning_effort"] == "high"
    post("/chat/completions", messages=HI, reasoning_effort="none")
    assert chat.CALLS[-1][1]["enable_thinking"] is False
    post("/chat/completions", messages=HI, reasoning_effort="minimal")
    assert chat.CALLS[-1][1]["reasoning_effort"] == "low"
    r = post("/chat/completions", messages=HI, reasoning_effort="extreme")
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"


@pytest.mark.parametrize("script", [
    ["<think>", "Let me", " think.", "</think>", "\n\nParis", "."],
    # gpt-oss's channels: only the web UI's own splitter knows them
    ["<|channel|>analysis<|message|>", "Let me", " think.", "<|end|>", "<|start|>assistant",
     "<|channel|>final<|message|>", "Paris", "."],
])
def test_thinking_comes_back_apart_from_the_answer(extension, post, host_modules, script):
    host_modules.text_generation.SCRIPT = script
    client = openai.OpenAI(base_url=extension.server.url, api_key="x", max_retries=0,
                           _strict_response_validation=True)
    resp = client.chat.completions.create(model="x", messages=HI)
    assert resp.choices[0].message.content == "Paris."
    assert resp.choices[0].message.model_extra["reasoning_content"] == "Let me think."
    r = post("/chat/completions", messages=HI, stream=True)
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "Let me think."
    assert "".join(d.get("content") or "" for d in deltas) == "Paris."
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_content:])   # thinking came first


def test_a_reply_without_thinking_has_no_reasoning_content(post):
    r = post("/chat/completions", messages=HI)
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "Hello, world!" and "reasoning_content" not in message
