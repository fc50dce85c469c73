"""The embedded llama.cpp host on its own: text decoding, prompts, sampling settings."""

from __future__ import annotations

import threading

import pytest

from openai_ext.hosts.base import Prompt
from openai_ext.hosts.request import GenerationSettings

TEXT = "Dragons 🐉 say naïve things in 日本語 🙂!"


def test_multibyte_characters_are_never_emitted_partially(llama_host):
    tokens = llama_host.tokenize(TEXT, add_bos=False)
    pieces = [llama_host.runtime.piece(t, False) for t in tokens]
    # the test only means something if some character is split across tokens
    assert any(_incomplete_utf8(p) for p in pieces), "no multi-token character in the sample"
    detok = llama_host.detokenizer()
    out = [detok.push(t) for t in tokens] + [detok.flush()]
    assert "".join(out) == TEXT
    assert all("\ufffd" not in o for o in out)


def _incomplete_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_greedy_generation_is_deterministic_and_counts_tokens(llama_host):
    prompt = llama_host.chat_prompt([{"role": "user", "content": "Count to five."}])
    p = Prompt(prompt.text, llama_host.tokenize(prompt.text))
    settings = GenerationSettings(max_new_tokens=9, temperature=0.0)
    runs = [list(llama_host.generate(p, settings, threading.Event())) for _ in range(2)]
    assert [x.text for x in runs[0]] == [x.text for x in runs[1]]
    assert sum(x.tokens for x in runs[0]) == 9 and runs[0][-1].finish_reason == "length"


def test_stop_event_stops_before_the_next_token(llama_host):
    prompt = llama_host.tokenize("Once upon a time")
    stop = threading.Event()
    settings = GenerationSettings(max_new_tokens=500, temperature=0.0)
    got = []
    for piece in llama_host.generate(Prompt("Once upon a time", prompt), settings, stop):
        got.append(piece)
        if len(got) == 3:
            stop.set()
    assert len(got) == 3
    assert llama_host.idle()


def test_chat_template_comes_from_the_gguf(llama_host):
    assert llama_host.has_chat_template
    text = llama_host.chat_prompt([{"role": "user", "content": "hi"}]).text
    assert "<|im_start|>user\nhi<|im_end|>" in text


def test_a_character_cut_off_at_the_end_is_dropped_not_replaced(llama_host):
    tokens = llama_host.tokenize("🐉", add_bos=False)
    assert len(tokens) > 1
    detok = llama_host.detokenizer()
    out = [detok.push(t) for t in tokens[:-1]] + [detok.flush()]
    assert "".join(out) == ""


@pytest.mark.slow   # tokenizes a long text twice, whole and in pieces
def test_a_long_text_is_tokenized_in_pieces_that_give_the_same_tokens(llama_host):
    import random


    rng = random.Random(7)
    parts = ["<|im_start|>", "<|im_end|>", "hello", " world", "\n", "  ", "<|endoftext|>", "é", "<|im_", "end|>",
             "x" * 3000, "<|im_start|>" * 3, " \n "]
    rt = llama_host.runtime
    cut = 0
    for _ in range(20):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 2000)))
        for bos in (False, True):
            whole = rt.model.tokenize(text.encode(), add_bos=bos and rt.add_bos, special=True)
            if len(whole) > 1 and whole[0] == whole[1] == rt.bos:
                whole = whole[1:]
            assert llama_host.tokenize(text, add_bos=bos) == whole
        cut += len(llama_host._pieces(text)) > 1
    assert cut > 10   # most texts were long enough to be cut


def test_the_longest_token_is_known_so_a_text_that_cannot_fit_is_known_before_tokenizing(llama_host):
    longest = max(len(llama_host.runtime.piece(t, True)) for t in range(llama_host.abilities.vocab_size))
    assert llama_host.max_token_bytes == longest and 1 < longest < 256


def test_internal_logits_on_the_embedded_host(live):
    """/v1/internal/logits as the web UI's API has it, from the real model's distribution."""
    import httpx

    r = httpx.post(f"{live.url}/internal/logits", json={"prompt": "The capital of France is", "top_logits": 5},
                   timeout=60)
    assert r.status_code == 200, r.text
    probs = list(r.json()["logits"].values())
    assert len(probs) == 5 and probs == sorted(probs, reverse=True)
    assert 0 < sum(probs) <= 1 + 1e-6
    assert "Paris" in "".join(r.json()["logits"])   # a small model still knows this one
    refused = httpx.post(f"{live.url}/internal/logits", json={"prompt": "x", "use_samplers": True}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "use_samplers"


def test_the_web_uis_fields_on_the_embedded_host(live):
    """Without the web UI there are no characters, templates or presets to load: a field that
    would change the answer is a 400 naming it; one that would not is ignored."""
    import httpx

    hi = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    for field, value in (("mode", "chat"), ("character", "Pirate"), ("instruction_template", "Alpaca"),
                         ("user_name", "Ann"), ("preset", "Creative")):
        r = httpx.post(f"{live.url}/chat/completions", json={**hi, field: value}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert "web UI" in r.json()["error"]["message"]
    for field, value in (("enable_thinking", False), ("reasoning_effort", "low"), ("max_tokens_second", 5),
                         ("truncation_length", 2048), ("mode", "instruct"), ("character", None),
                         ("continue_", False), ("preset", "")):   # what this host does anyway
        r = httpx.post(f"{live.url}/chat/completions", json={**hi, field: value}, timeout=60)
        assert r.status_code == 200, r.text


def test_flash_attention_is_on_with_several_sequences_unless_set():
    from openai_ext.hosts.llamacpp.context import uses_flash_attn

    assert uses_flash_attn("auto", 4) and not uses_flash_attn("auto", 1)
    assert uses_flash_attn("on", 1) and not uses_flash_attn("off", 8)


def greedy_chain(settings, biases=None, vocab=None) -> bool:
    """Whether the chain built for ``settings`` is llama.cpp's greedy sampler alone."""
    import llama_cpp

    from openai_ext.hosts.llamacpp.sampling import greedy_alone, sampler_chain

    chain = sampler_chain(llama_cpp, vocab, 49152, 2048, settings, biases or {})
    try:
        return greedy_alone(llama_cpp, chain)
    finally:
        llama_cpp.llama_sampler_free(chain)


def test_plain_greedy_is_the_greedy_chain_alone():
    """A generation takes the logits' argmax itself only where llama.cpp's chain is its greedy
    sampler alone: anything the chain adds before it (a bias, a penalty, DRY) keeps it."""
    greedy = GenerationSettings(max_new_tokens=8, temperature=0.0)
    assert greedy_chain(greedy)
    assert not greedy_chain(greedy, {5: -100.0})
    assert not greedy_chain(GenerationSettings(max_new_tokens=8))            # OpenAI's default: 1.0
    assert not greedy_chain(GenerationSettings(max_new_tokens=8, temperature=0.7))
    assert not greedy_chain(greedy.replace(frequency_penalty=0.5))
    assert not greedy_chain(greedy.replace(presence_penalty=-0.5))
    assert not greedy_chain(greedy.replace(samplers={"repetition_penalty": 1.1}))
    # (DRY needs a model's vocabulary: see the next test)


@pytest.mark.slow
def test_a_plain_greedy_generation_takes_the_argmax_and_writes_what_the_chain_writes(llama_host, monkeypatch):
    from openai_ext.hosts.llamacpp import work

    greedy = GenerationSettings(max_new_tokens=8, temperature=0.0)
    assert not greedy_chain(greedy.replace(samplers={"dry_multiplier": 0.8}), vocab=llama_host.runtime.vocab)
    settings = GenerationSettings(max_new_tokens=150, temperature=0.0)
    text = llama_host.chat_prompt([{"role": "user", "content": "Describe a harbor town at dawn."}]).text
    prompt = Prompt(text, llama_host.tokenize(text))
    chosen: list[bool] = []
    real = work.greedy_alone
    monkeypatch.setattr(work, "greedy_alone", lambda L, chain: chosen.append(real(L, chain)) or chosen[-1])
    fast = [p.text for p in llama_host.generate(prompt, settings, threading.Event())]
    monkeypatch.setattr(work, "greedy_alone", lambda L, chain: chosen.append(False) or False)
    chain = [p.text for p in llama_host.generate(prompt, settings, threading.Event())]
    assert chosen == [True, False]
    assert len(fast) > 50 and fast == chain


@pytest.mark.slow
def test_a_logits_row_keeps_its_view_and_reads_what_the_last_decode_wrote(llama_host):
    """The view of a row of logits is made once for its address (made after every decode it cost
    more than the argmax read through it), and reads the values llama.cpp holds now."""
    import numpy as np

    rt = llama_host.runtime

    def decode_two(text: str) -> None:   # the prompt's step, then a step of one token: output 0
        prompt = Prompt(text, llama_host.tokenize(text))
        list(llama_host.generate(prompt, GenerationSettings(max_new_tokens=2, temperature=0.0), threading.Event()))

    def fresh() -> np.ndarray:
        return np.ctypeslib.as_array(rt.L.llama_get_logits_ith(rt.ctx, 0), shape=(rt.n_vocab,)).copy()

    decode_two("The capital of France is")
    first = rt.logits(0)
    assert rt.logits(0) is first and np.array_equal(first, fresh())
    before = first.copy()
    decode_two("Once upon a time, in a land far away,")
    now = rt.logits(0)
    assert np.array_equal(now, fresh()) and not np.array_equal(now, before)
