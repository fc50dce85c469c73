"""How the embedded host's KV cache keeps its values (the cache_type_v setting,
llamacpp/context.py and llamacpp/values.py): where flash attention runs on the CPU, f16 or q8_0,
whichever this machine decodes faster (timed once and kept), f16 elsewhere; and the answer the same
either way up to a near tie.

Which kind wins depends on the CPU and the build the tests run on, so no test expects one
verdict of the real timing: where the verdict is the subject, the timings are set by the test."""

from __future__ import annotations

import pytest
from test_batching import GREEDY, assert_same_greedy_answer, generate

from openai_ext.hosts.files import default_gguf
from openai_ext.hosts.llamacpp import probe, values
from openai_ext.hosts.llamacpp.context import load_model, value_cache_type


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Verdicts go to a folder of the test's own, never the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model():
    loaded = load_model(default_gguf(), extra_buffers=False)
    yield loaded
    loaded.close()


def timings(monkeypatch, f16_s: float, q8_s: float) -> list[int]:
    """The timed decodes take these seconds; returns one entry per timing run."""
    runs: list[int] = []

    def time_decodes(model, n_threads):
        runs.append(n_threads)
        return {"f16": f16_s, "q8_0": q8_s}
    monkeypatch.setattr(values, "time_decodes", time_decodes)
    return runs


def test_auto_is_timed_only_where_flash_attention_runs_on_the_cpu():
    assert value_cache_type("auto", flash_attn=True, n_gpu_layers=0) is None
    assert value_cache_type("auto", flash_attn=False, n_gpu_layers=0) == "f16"
    assert value_cache_type("auto", flash_attn=True, n_gpu_layers=-1) == "f16"
    assert value_cache_type("bf16", flash_attn=False, n_gpu_layers=0) == "bf16"
    assert value_cache_type("q8_0", flash_attn=True, n_gpu_layers=0) == "q8_0"
    with pytest.raises(ValueError, match="q8_0 needs flash attention: set flash_attn on"):
        value_cache_type("q8_0", flash_attn=False, n_gpu_layers=0)


def test_q8_0_only_where_it_is_clearly_faster():
    assert values.pick(f16_s=0.078, q8_s=0.027) == "q8_0"   # f16 values summed element by element
    assert values.pick(f16_s=0.016, q8_s=0.021) == "f16"    # both summed in vectors
    assert values.pick(f16_s=0.030, q8_s=0.028) == "f16"    # about the same: the exact one


def test_the_timing_runs_once_and_its_verdict_is_kept(monkeypatch, model):
    timed = timings(monkeypatch, f16_s=0.078, q8_s=0.027)
    first = values.choose(default_gguf(), model, n_gpu_layers=0, n_threads=None)
    assert first.kind == "q8_0" and len(timed) == 1
    assert "78.0 ms with f16 values and 27.0 ms with q8_0" in first.reason
    again = values.choose(default_gguf(), model, n_gpu_layers=0, n_threads=None)
    assert again.kind == "q8_0" and len(timed) == 1   # not timed again
    assert "kept from an earlier start" in again.reason and "--cache-type-v" in again.reason
    # kept per model file, build and CPU, beside the CPU test's verdicts
    kept = probe.read_verdicts(values._file())
    assert kept[probe.probe_key(default_gguf(), 0)]["kind"] == "q8_0"


def test_a_value_head_of_whole_vector_steps_keeps_f16_untimed(monkeypatch, model):
    timed = timings(monkeypatch, f16_s=0.078, q8_s=0.027)
    monkeypatch.setattr(values, "value_head", lambda m: 128)
    choice = values.choose(default_gguf(), model, n_gpu_layers=0, n_threads=None)
    assert choice.kind == "f16" and timed == [] and "128 elements" in choice.reason


def test_a_timing_that_cannot_run_keeps_f16_for_this_start(monkeypatch, model):
    def fails(model, n_threads):
        raise RuntimeError("llama_decode failed while timing the KV value types")
    monkeypatch.setattr(values, "time_decodes", fails)
    choice = values.choose(default_gguf(), model, n_gpu_layers=0, n_threads=None)
    assert choice.kind == "f16" and "could not run (llama_decode failed" in choice.reason
    assert probe.read_verdicts(values._file()) == {}   # tried again at the next start


def test_the_value_head_is_read_off_the_gguf(model):
    assert values.value_head(model) == 64   # SmolLM2-135M: 576 wide, 9 heads


@pytest.mark.slow   # (it decodes with the real model, in a child process, for about 12 s)
def test_the_real_timing_gives_a_verdict_with_its_figures(model):
    timed = values.time_decodes(model, 2)
    assert set(timed) == {"f16", "q8_0"} and all(0 < s < float("inf") for s in timed.values())
    choice = values.choose(default_gguf(), model, n_gpu_layers=0, n_threads=2)
    assert choice.kind in ("f16", "q8_0")
    assert f"one token {values.DEPTH} cells deep decoded in" in choice.reason


def make_host(parallel: int, cache_type_v: str = "auto"):
    from openai_ext.hosts.llamacpp import LlamaCppHost

    return LlamaCppHost(default_gguf(), n_ctx=2048, parallel=parallel, speculation="off", cache_type_v=cache_type_v)


@pytest.mark.slow
def test_values_in_q8_0_give_the_answer_f16_values_give():
    text = "Explain in three sentences why the sky is blue."
    settings = GREEDY.replace(max_new_tokens=80, logprobs=2, samplers={"ban_eos_token": True})
    answers = {}
    for kind in ("q8_0", "f16"):
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


@pytest.mark.slow
def test_the_host_keeps_its_values_as_the_timing_chose(monkeypatch):
    timings(monkeypatch, f16_s=0.078, q8_s=0.027)
    host = make_host(2)
    try:
        assert host.describe()["cache_type_v"] == "q8_0" and host.describe()["flash_attn"]
    finally:
        host.close()
