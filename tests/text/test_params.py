"""The one mapping from OpenAI parameters to host settings, tested on its own."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import ValidationError
from support import DATA, ROOT

from openai_ext.core.api_model import unknown_fields
from openai_ext.core.errors import InvalidRequestError, from_validation_errors
from openai_ext.text import webui_fields
from openai_ext.text.params import (
    HOST_SAMPLERS,
    RULES,
    HostAbilities,
    markdown_table,
    plan,
)
from openai_ext.text.protocol import ChatCompletionRequest, CompletionRequest

FULL = HostAbilities(samplers=frozenset(HOST_SAMPLERS), logprobs=True, logit_bias=True, fim=False, vocab_size=1000)
GRAMMAR = HostAbilities(samplers=frozenset(), grammar=True, lazy_grammar=True)
BARE = HostAbilities(samplers=frozenset({"top_k"}))
MSG = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return ChatCompletionRequest(messages=MSG, **kw)


def comp(**kw):
    return CompletionRequest(prompt="hi", **kw)


def test_openai_defaults():
    p = plan(chat(), abilities=FULL, room=500, max_n=4)
    s = p.settings
    assert s.max_new_tokens == 500            # chat: the rest of the context
    assert (s.temperature, s.top_p, s.greedy) == (1.0, 1.0, False)
    assert (s.presence_penalty, s.frequency_penalty, s.seed) == (0.0, 0.0, None)
    assert p.stops == [] and s.logprobs is None and s.samplers == {} and s.grammar is None
    assert (p.n, p.best_of, p.stream, p.include_usage, p.logprobs) == (1, 1, False, False, None)
    assert plan(comp(), abilities=FULL, room=500, max_n=4).settings.max_new_tokens == 16


def test_max_tokens_is_clamped_to_room():
    assert plan(chat(max_tokens=900), abilities=FULL, room=100, max_n=1).settings.max_new_tokens == 100
    assert plan(chat(max_tokens=900, max_completion_tokens=7), abilities=FULL, room=100,
                max_n=1).settings.max_new_tokens == 7
    assert plan(comp(max_tokens=0), abilities=FULL, room=100, max_n=1).settings.max_new_tokens == 0


def test_temperature_zero_is_greedy():
    s = plan(chat(temperature=0), abilities=FULL, room=10, max_n=1).settings
    assert s.greedy and s.temperature == 0


def test_stop_string_or_list():
    assert plan(chat(stop="\n"), abilities=FULL, room=10, max_n=1).stops == ["\n"]
    p = plan(chat(stop=["a", "", "b"]), abilities=FULL, room=10, max_n=1)
    assert p.stops == ["a", "b"]
    # the server applies them (holding back what may become one): the host is not given them
    assert p.settings == plan(chat(), abilities=FULL, room=10, max_n=1).settings


def test_seed_per_choice():
    p = plan(chat(seed=10, n=3), abilities=FULL, room=10, max_n=4)
    assert [p.settings_for_choice(i).seed for i in range(3)] == [10, 11, 12]
    unseeded = plan(chat(n=2), abilities=FULL, room=10, max_n=4)
    assert unseeded.settings_for_choice(1).seed is None


def test_logprobs_mapping():
    assert plan(chat(logprobs=True), abilities=FULL, room=10, max_n=1).logprobs == 0
    p = plan(chat(logprobs=True, top_logprobs=5), abilities=FULL, room=10, max_n=1)
    assert p.logprobs == 5 and p.settings.logprobs == 5
    assert plan(comp(logprobs=3), abilities=FULL, room=10, max_n=1).logprobs == 3
    with pytest.raises(InvalidRequestError) as e:
        plan(chat(logprobs=True), abilities=BARE, room=10, max_n=1)
    assert e.value.param == "logprobs"


def test_logit_bias_is_checked_and_kept_as_token_id_strings():
    p = plan(chat(logit_bias={"5": -100, "7": 3}), abilities=FULL, room=10, max_n=1)
    assert p.settings.logit_bias == {5: -100.0, 7: 3.0}
    for bad in ({"x": 1}, {"1000": 1}, {"-1": 1}):
        with pytest.raises(InvalidRequestError):
            plan(chat(logit_bias=bad), abilities=FULL, room=10, max_n=1)
    with pytest.raises(InvalidRequestError):
        plan(chat(logit_bias={"5": 1}), abilities=BARE, room=10, max_n=1)


def test_host_samplers_as_extra_fields():
    p = plan(ChatCompletionRequest(messages=MSG, top_k=40, min_p=0.1, mode="instruct"),
             abilities=FULL, room=10, max_n=1)
    assert p.settings.samplers == {"top_k": 40, "min_p": 0.1}
    assert p.ignored == []   # mode is the web UI's chat mode, which chat.template_input reads
    with pytest.raises(InvalidRequestError) as e:
        plan(ChatCompletionRequest(messages=MSG, min_p=0.1), abilities=BARE, room=10, max_n=1)
    assert e.value.param == "min_p"
    with pytest.raises(InvalidRequestError) as e:
        plan(ChatCompletionRequest(messages=MSG, top_k=1.5), abilities=FULL, room=10, max_n=1)
    assert e.value.param == "top_k"


def test_a_host_sampler_or_web_ui_field_sent_as_null_is_left_out():
    """null is "not sent" for the host's samplers and the web UI's fields too, as for OpenAI's
    parameters: the backend's (or the preset's) value stands, and a backend without that sampler
    does not refuse it."""
    web_ui = dataclasses.replace(FULL, web_ui=True)
    for abilities in (FULL, BARE, web_ui):
        p = plan(ChatCompletionRequest(messages=MSG, top_k=None, min_p=None, mode=None, preset=None,
                                       enable_thinking=None), abilities=abilities, room=10, max_n=1)
        assert p.settings.samplers == {} and p.settings.preset is None and p.ignored == []
    assert webui_fields.template_settings(chat(mode=None, enable_thinking=None).sent_extra(), web_ui, chat=True) == {}


@pytest.mark.parametrize("bans, ok", [("1, 2,3", "1,2,3"), ("", ""), ("abc", None), ("5,-1", None),
                                      ("999", "999"), ("1000", None)])
def test_custom_token_bans_are_token_ids(bans, ok):
    req = ChatCompletionRequest(messages=MSG, custom_token_bans=bans)
    if ok is None:
        with pytest.raises(InvalidRequestError) as e:
            plan(req, abilities=FULL, room=10, max_n=1)
        assert e.value.param == "custom_token_bans" and "0..999" in e.value.message
    else:
        assert plan(req, abilities=FULL, room=10, max_n=1).settings.samplers["custom_token_bans"] == ok


def test_ignored_parameters_are_reported_not_applied():
    p = plan(chat(user="u", store=True, metadata={"a": "b"}, reasoning_effort="low", service_tier="auto"),
             abilities=FULL, room=10, max_n=1)
    assert p.ignored == ["metadata", "reasoning_effort", "service_tier", "store", "user"]
    assert p.settings == plan(chat(), abilities=FULL, room=10, max_n=1).settings


@pytest.mark.parametrize("req, param", [
    (chat(n=5), "n"),
    (chat(top_logprobs=3), "top_logprobs"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(response_format={"type": "json_object"}), "response_format"),   # BARE-like: FULL has no grammar
    (chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (chat(response_format={"type": "yaml"}), "response_format.type"),
    (chat(modalities=["audio"]), "modalities"),
    (chat(audio={"voice": "alloy"}), "audio"),
    (chat(web_search_options={}), "web_search_options"),
    (comp(best_of=1, n=2), "best_of"),
    (comp(best_of=3, stream=True), "best_of"),
    (comp(best_of=5), "best_of"),
    (comp(suffix="x"), "suffix"),
])
def test_rejections_name_the_parameter(req, param):
    with pytest.raises(InvalidRequestError) as e:
        plan(req, abilities=FULL, room=10, max_n=4)
    assert e.value.param == param and e.value.message


def test_response_format_becomes_a_grammar():
    s = plan(chat(response_format={"type": "json_object"}), abilities=GRAMMAR, room=10, max_n=1).settings
    assert "root ::= j-object" in s.grammar
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    s = plan(chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}),
             abilities=GRAMMAR, room=10, max_n=1).settings
    assert '"\\"a\\""' in s.grammar and s.grammar_triggers == ()
    assert plan(chat(response_format={"type": "text"}), abilities=GRAMMAR, room=10,
                max_n=1).settings.grammar is None


def test_tool_choice_becomes_a_grammar_lazy_only_for_auto():
    from openai_ext.text import tools

    fn = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    for choice, lazy in (("required", False), ("auto", True)):
        req = chat(tools=[fn], tool_choice=choice)
        s = plan(req, abilities=GRAMMAR, room=10, max_n=1, toolset=tools.parse(req)).settings
        assert "tool-call-block" in s.grammar
        assert bool(s.grammar_triggers) == lazy
    # a host without lazy grammars leaves auto unconstrained, and cannot promise required
    req = chat(tools=[fn])
    assert plan(req, abilities=BARE, room=10, max_n=1, toolset=tools.parse(req)).settings.grammar is None
    req = chat(tools=[fn], tool_choice="required")
    with pytest.raises(InvalidRequestError) as e:
        plan(req, abilities=BARE, room=10, max_n=1, toolset=tools.parse(req))
    assert e.value.param == "tool_choice"
    # response_format with auto: one grammar, from the start, allows calls or the JSON answer
    req = chat(tools=[fn], response_format={"type": "json_object"})
    s = plan(req, abilities=GRAMMAR, room=10, max_n=1, toolset=tools.parse(req)).settings
    assert "| response" in s.grammar and s.grammar_triggers == ()
    with pytest.raises(InvalidRequestError) as e:
        plan(req, abilities=BARE, room=10, max_n=1, toolset=tools.parse(req))
    assert e.value.param == "response_format"


def test_accepted_no_op_switches():
    """Switches that ask for what happens anyway are accepted and change nothing."""
    switched = plan(chat(tool_choice="none", function_call="none", modalities=["text"],
                         response_format={"type": "text"}), abilities=FULL, room=10, max_n=1)
    plain = plan(chat(), abilities=FULL, room=10, max_n=1)
    assert switched.settings == plain.settings and switched.settings.grammar is None
    assert (switched.n, switched.stream, switched.logprobs, switched.stops) == (plain.n, plain.stream, plain.logprobs,
                                                                                plain.stops)


def test_best_of_needs_logprobs_from_the_host():
    p = plan(comp(best_of=3), abilities=FULL, room=10, max_n=4)
    # the host computes log-probabilities to rank the candidates; the client sees none
    assert p.best_of == 3 and p.settings.logprobs == 0 and p.logprobs is None
    assert plan(comp(best_of=2, n=2), abilities=FULL, room=10, max_n=4).settings.logprobs is None
    with pytest.raises(InvalidRequestError):
        plan(comp(best_of=3), abilities=BARE, room=10, max_n=4)


@pytest.mark.parametrize("make, fields, param, hint", [
    (chat, {"frobnicate": True}, "frobnicate", None),
    (chat, {"max_token": 5}, "max_token", "Did you mean 'max_tokens'?"),
    (comp, {"top_kk": 5}, "top_kk", "Did you mean 'top_k'?"),
    (comp, {"messages": MSG}, "messages", "It is a parameter of /v1/chat/completions."),
    (comp, {"mode": "chat"}, "mode", "It is a parameter of /v1/chat/completions."),
    (chat, {"echo": True}, "echo", "It is a parameter of /v1/completions."),
])
def test_unknown_fields_are_refused_by_name(make, fields, param, hint):
    """The request model refuses them (core.api_model), before any plan is made."""
    with pytest.raises(ValidationError) as v:
        make(**fields)
    e = from_validation_errors(list(v.value.errors()))   # the 400 the client gets
    assert e.param == param and e.code == "unknown_parameter"
    assert e.message.startswith(f"Unrecognized request argument supplied: {param}.")
    assert hint is None or hint in e.message


def test_web_ui_fields_map_on_the_web_ui_and_the_setting_allows_unknown_fields():
    web_ui = dataclasses.replace(FULL, web_ui=True)
    p = plan(chat(mode="instruct", character="Assistant", preset="simple-1", truncation_length=9),
             abilities=web_ui, room=10, max_n=1)
    assert p.ignored == ["truncation_length"] and p.settings.preset == "simple-1"
    # the preset's samplers, unless the request names them
    assert (p.settings.temperature, p.settings.top_p) == (None, None)
    assert plan(chat(preset="simple-1", temperature=0.5), abilities=web_ui, room=10, max_n=1).settings.temperature == 0.5
    # null is as good as left out: the preset decides (a family's chat request names every field it maps)
    assert plan(chat(preset="simple-1", temperature=None), abilities=web_ui, room=10, max_n=1).settings.temperature \
        is None
    with pytest.raises(InvalidRequestError) as e:   # a host without the web UI has no presets
        plan(chat(preset="simple-1"), abilities=FULL, room=10, max_n=1)
    assert e.value.param == "preset"
    with unknown_fields(True):   # the allow_unknown_fields setting, as a request of such a server has it
        req = chat(frobnicate=True)
    p = plan(req, abilities=FULL, room=10, max_n=1)
    assert p.ignored == ["frobnicate"] and p.settings == plan(chat(), abilities=FULL, room=10, max_n=1).settings


@pytest.mark.parametrize("schema, request_class", [
    ("CreateChatCompletionRequest", ChatCompletionRequest), ("CreateCompletionRequest", CompletionRequest)])
def test_every_openai_parameter_is_accepted_on_its_endpoint(schema, request_class):
    """No parameter of OpenAI's own request schema may be refused as unknown."""
    endpoint = "chat" if request_class is ChatCompletionRequest else "completions"
    accepted = set(request_class.model_fields) | {r.name for r in RULES if r.endpoint in ("both", endpoint)}
    missing = _spec_properties(schema) - accepted
    assert not missing, f"OpenAI parameters that would be refused as unknown: {sorted(missing)}"


def _spec_properties(name: str) -> set[str]:
    """Every request property of one of OpenAI's schemas (its own and those of its allOf parts)."""
    spec = json.loads((DATA / "openai-openapi" / "openapi.json").read_text())
    schemas = spec["components"]["schemas"]

    def props(schema: dict) -> set[str]:
        out = set(schema.get("properties", {}))
        for part in schema.get("allOf", []):
            out |= props(schemas[part["$ref"].rsplit("/", 1)[1]] if "$ref" in part else part)
        return out
    return props(schemas[name])


def test_every_openai_parameter_has_a_rule():
    """Both this server's request models and OpenAI's own request schemas: a parameter OpenAI
    adds shows up here until it has a rule (mapped, handled, ignored or rejected)."""
    fields = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    fields |= _spec_properties("CreateChatCompletionRequest") | _spec_properties("CreateCompletionRequest")
    ruled = {r.name for r in RULES}
    assert fields <= ruled, f"parameters without a rule: {sorted(fields - ruled)}"


def test_readme_shows_the_generated_table():
    readme = (ROOT / "README.md").read_text()
    assert markdown_table() in readme, "README's parameter table is stale: paste params.markdown_table()"


def test_the_embedded_hosts_samplers_are_its_typed_options_each_one_read():
    """The llama.cpp host's samplers are the fields of its options model: every sampler a request
    names there is read into it (none is accepted and ignored), and add_bos_token, which it
    cannot honour (the prompt is tokenized before the samplers are read), is refused by name."""
    from openai_ext.hosts.llamacpp.sampling import SAMPLERS, Options
    from openai_ext.hosts.request import GenerationSettings

    abilities = HostAbilities(samplers=SAMPLERS)
    with pytest.raises(InvalidRequestError) as e:
        plan(ChatCompletionRequest(messages=MSG, add_bos_token=False), abilities=abilities, room=10, max_n=1)
    assert e.value.param == "add_bos_token"
    every = {name: HOST_SAMPLERS[name](0 if HOST_SAMPLERS[name] is not str else "") for name in SAMPLERS}
    p = plan(ChatCompletionRequest(messages=MSG, **every), abilities=abilities, room=10, max_n=1)
    options = Options.of(p.settings)
    assert options.model_dump() == {**Options().model_dump(), **p.settings.samplers}
    with pytest.raises(ValueError):   # a name the model does not have is no option
        Options.of(GenerationSettings(max_new_tokens=1, samplers={"top_kk": 1}))
