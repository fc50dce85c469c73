"""How the embedded host's KV cache keeps its values (the cache_type_v setting,
llamacpp/context.py): q8_0 where flash attention runs on the CPU, f16 elsewhere, and the answer
the same either way up to a near tie."""

from __future__ import annotations

import pytest
from test_batching import GREEDY, assert_same_greedy_answer, generate

from openai_ext.hosts.llamacpp.context import value_cache_type


def test_auto_keeps_values_in_q8_0_only_where_flash_attention_runs_on_the_cpu():
    assert value_cache_type("auto", flash_attn=True, n_gpu_layers=0) == "q8_0"
    assert value_cache_type("auto", flash_attn=False, n_gpu_layers=0) == "f16"
    assert value_cache_type("auto", flash_attn=True, n_gpu_layers=-1) == "f16"
    assert value_cache_type("bf16", flash_attn=False, n_gpu_layers=0) == "bf16"
    with pytest.raises(ValueError, match="q8_0 needs flash attention: set flash_attn on"):
        value_cache_type("q8_0", flash_attn=False, n_gpu_layers=0)


def make_host(parallel: int, cache_type_v: str = "auto"):
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    return LlamaCppHost(default_gguf(), n_ctx=2048, parallel=parallel, speculation="off", cache_type_v=cache_type_v)


@pytest.mark.slow
def test_values_in_q8_0_give_the_answer_f16_values_give():
    text = "Explain in three sentences why the sky is blue."
    settings = GREEDY.replace(max_new_tokens=80, logprobs=2, samplers={"ban_eos_token": True})
    answers = {}
    for kind in ("auto", "f16"):
        host = make_host(2, kind)
        try:
            answers[host.describe()["cache_type_v"]] = generate(host, text, settings)
        finally:
            host.close()
    assert set(answers) == {"q8_0", "f16"}
    assert_same_greedy_answer(answers["f16"], answers["q8_0"])


@pytest.mark.slow
def test_one_sequence_keeps_f16_values_and_q8_0_without_flash_attention_is_refused():
    host = make_host(1)
    try:
        assert host.describe()["cache_type_v"] == "f16" and not host.describe()["flash_attn"]
    finally:
        host.close()
    with pytest.raises(ValueError, match="cache_type_v q8_0 needs flash attention"):
        make_host(1, "q8_0")
