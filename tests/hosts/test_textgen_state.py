"""The hosts' typed request in the web UI's vocabulary (hosts/textgen/state.py): the names and
values its generation functions read, as its own API fills them."""

from __future__ import annotations

from types import SimpleNamespace

from openai_ext.hosts.request import ChatOptions, GenerationSettings
from openai_ext.hosts.textgen.state import generation_state, request_state


def test_openai_defaults_in_the_web_uis_names():
    state = generation_state(GenerationSettings(max_new_tokens=50))
    assert state == {"auto_max_new_tokens": False, "stream": True, "max_new_tokens": 50, "temperature": 1.0,
                     "do_sample": True, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                     "seed": -1}


def test_greedy_sets_top_k_one_unless_the_request_names_top_k():
    greedy = GenerationSettings(max_new_tokens=5, temperature=0.0)
    assert generation_state(greedy)["do_sample"] is False and generation_state(greedy)["top_k"] == 1
    assert generation_state(greedy.replace(samplers={"top_k": 7}))["top_k"] == 7


def test_every_field_is_carried():
    s = GenerationSettings(max_new_tokens=9, seed=3, logit_bias={5: -100.0}, logprobs=2, grammar='root ::= "a"',
                           samplers={"min_p": 0.1, "ban_eos_token": True}, preset="simple-1", max_tokens_second=4)
    state = generation_state(s)
    assert state["seed"] == 3 and state["logit_bias"] == {"5": -100.0} and state["logprobs"] == 2
    assert state["grammar_string"] == 'root ::= "a"' and state["preset"] == "simple-1"
    assert state["max_tokens_second"] == 4 and state["min_p"] == 0.1 and state["ban_eos_token"] is True


def test_a_sampler_left_to_a_preset_is_left_out():
    """So the preset's value stays (its samplers are applied before these: request_state, and
    end to end in test_extension_webui_fields)."""
    state = generation_state(GenerationSettings(max_new_tokens=5, temperature=None, top_p=None, preset="Creative"))
    assert not {"temperature", "do_sample", "top_p", "top_k"} & set(state) and state["preset"] == "Creative"


def test_chat_options_reach_the_state_and_the_mode_is_instruct_unless_named():
    m = SimpleNamespace(shared=SimpleNamespace(settings={"mode": "chat"}))
    assert request_state(m)["mode"] == "instruct"   # the API's default, whatever the UI's is
    options = ChatOptions(tools=[{"type": "function"}], mode="chat", enable_thinking=False, name1="Ann",
                          continue_=True)
    state = request_state(m, options=options)
    assert state["mode"] == "chat" and state["tools"] == [{"type": "function"}] and state["name1"] == "Ann"
    assert state["enable_thinking"] is False and state["continue_"] is True
