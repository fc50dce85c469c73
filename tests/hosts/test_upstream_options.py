"""The upstream host's samplers, typed (hosts/upstream/options.py): what each kind of engine is sent."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from openai_ext.core.errors import InvalidRequestError
from openai_ext.hosts.base import HOST_SAMPLERS, Prompt
from openai_ext.hosts.request import GenerationSettings
from openai_ext.hosts.upstream import UpstreamHost, options
from openai_ext.hosts.upstream.options import TAKES, Options

VALUES = {"top_k": 20, "min_p": 0.05, "typical_p": 0.9, "top_n_sigma": 1.5, "repetition_penalty": 1.1,
          "repetition_penalty_range": 64, "xtc_threshold": 0.2, "xtc_probability": 0.5, "dry_multiplier": 0.8,
          "dry_base": 1.75, "dry_allowed_length": 2, "mirostat_mode": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
          "ban_eos_token": True}


def settings(**samplers) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=4, samplers=samplers)


def test_every_sampler_an_engine_takes_is_one_of_ours_with_our_type():
    assert set(VALUES) == set(Options.model_fields)
    for dialect, names in TAKES.items():
        assert names <= set(Options.model_fields), dialect
    for name, value in VALUES.items():
        assert isinstance(value, HOST_SAMPLERS[name]), name
        assert Options.model_fields[name].annotation == HOST_SAMPLERS[name] | None, name


@pytest.mark.parametrize("dialect, expected", [
    ("llama.cpp", {"top_k": 20, "min_p": 0.05, "typical_p": 0.9, "top_n_sigma": 1.5, "repeat_penalty": 1.1,
                   "repeat_last_n": 64, "xtc_threshold": 0.2, "xtc_probability": 0.5, "dry_multiplier": 0.8,
                   "dry_base": 1.75, "dry_allowed_length": 2, "mirostat": 2, "mirostat_tau": 5.0,
                   "mirostat_eta": 0.1, "ignore_eos": True}),
    ("vllm", {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True}),
    ("openai_ext", {"top_k": 20, "min_p": 0.05, "typical_p": 0.9, "repetition_penalty": 1.1, "ban_eos_token": True}),
    ("generic", {}),
])
def test_each_engine_gets_the_samplers_it_takes_in_its_own_names(dialect, expected):
    taken = {name: VALUES[name] for name in options.takes(dialect)}
    assert options.engine_fields(dialect, settings(**taken)) == expected
    assert len(expected) == len(TAKES[dialect])   # each sampler it takes is written, once
    assert options.engine_fields(dialect, settings()) == {}   # none named: the engine's defaults


def test_a_sampler_no_engine_takes_is_refused_and_an_unknown_engine_takes_none():
    with pytest.raises(ValidationError):
        Options.of(settings(tfs=0.9))   # the web UI's; params.plan answers 400 before it gets here
    assert options.takes(None) == frozenset() and options.takes("sglang-unknown") == frozenset()
    assert options.engine_fields("sglang-unknown", settings(top_k=3)) == {}


# What each kind of engine answers to the routes the host asks to tell them apart (dialects.detect).
ENGINES = {
    "openai_ext": {"/v1/internal/model/info": {"model_name": "m", "n_ctx": 512}},
    "llama.cpp": {"/props": {"default_generation_settings": {"n_ctx": 512}}},
    "vllm": {"/v1/models": {"data": [{"id": "m", "max_model_len": 512}]}},
    "generic": {},
}
# The samplers each kind of engine took before they were typed (the name map the options replace).
BEFORE = {
    "llama.cpp": {"top_k", "min_p", "typical_p", "top_n_sigma", "repetition_penalty", "repetition_penalty_range",
                  "xtc_threshold", "xtc_probability", "dry_multiplier", "dry_base", "dry_allowed_length",
                  "mirostat_mode", "mirostat_tau", "mirostat_eta", "ban_eos_token"},
    "vllm": {"top_k", "min_p", "repetition_penalty", "ban_eos_token"},
    "openai_ext": {"top_k", "min_p", "typical_p", "repetition_penalty", "ban_eos_token"},
    "generic": set(),
}


@pytest.mark.parametrize("dialect", list(ENGINES))
def test_the_body_an_upstream_of_each_kind_gets(dialect, monkeypatch):
    """The whole /v1/completions body, from a scripted upstream (no network): the samplers named
    become the engine's own fields, beside the OpenAI ones, and the host says it takes them."""
    answers = {"/v1/models": {"data": [{"id": "m"}]}, **ENGINES[dialect]}

    def call(self, method, path, body=None, *, timeout=0.0):
        if path not in answers:
            raise InvalidRequestError(f"{path} is not served here", status=404)
        return answers[path]

    monkeypatch.setattr(UpstreamHost, "_call", call)
    host = UpstreamHost("http://upstream.invalid:9")
    try:
        assert host.describe()["engine"] == dialect
        assert host.abilities.samplers == BEFORE[dialect]
        named = {name: VALUES[name] for name in host.abilities.samplers}
        body = host._body(Prompt("Hi", [1, 2]), GenerationSettings(max_new_tokens=4, temperature=0.5, seed=7,
                                                                   samplers=named))
        openai = {"model": "m", "prompt": "Hi" if dialect == "generic" else [1, 2], "max_tokens": 4,
                  "temperature": 0.5, "top_p": 1.0, "stream": True, "seed": 7}
        assert body == {**openai, **options.engine_fields(dialect, settings(**named))}
        assert len(body) == len(openai) + len(named)
    finally:
        host.close()
