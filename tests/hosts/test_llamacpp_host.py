"""The embedded llama.cpp host on its own: text decoding, prompts, sampling settings."""

from __future__ import annotations

import threading

from openai_ext.hosts.base import Prompt

TEXT = "Dragons 🐉 say naïve things in 日本語 🙂!"


def test_multibyte_characters_are_never_emitted_partially(llama_host):
    tokens = llama_host.tokenize(TEXT, add_bos=False)
    pieces = [llama_host._piece(t, False) for t in tokens]
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
    prompt = llama_host.chat_prompt([{"role": "user", "content": "Count to five."}], {})
    p = Prompt(prompt.text, llama_host.tokenize(prompt.text))
    settings = {"max_new_tokens": 9, "temperature": 0.0, "do_sample": False, "top_p": 1.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0, "seed": -1}
    runs = [list(llama_host.generate(p, settings, threading.Event())) for _ in range(2)]
    assert [x.text for x in runs[0]] == [x.text for x in runs[1]]
    assert sum(x.tokens for x in runs[0]) == 9 and runs[0][-1].finish_reason == "length"


def test_stop_event_stops_before_the_next_token(llama_host):
    prompt = llama_host.tokenize("Once upon a time")
    stop = threading.Event()
    settings = {"max_new_tokens": 500, "temperature": 0.0, "do_sample": False, "top_p": 1.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0, "seed": -1}
    got = []
    for piece in llama_host.generate(Prompt("Once upon a time", prompt), settings, stop):
        got.append(piece)
        if len(got) == 3:
            stop.set()
    assert len(got) == 3
    assert llama_host.idle()


def test_chat_template_comes_from_the_gguf(llama_host):
    assert llama_host.has_chat_template
    text = llama_host.chat_prompt([{"role": "user", "content": "hi"}], {}).text
    assert "<|im_start|>user\nhi<|im_end|>" in text


def test_a_character_cut_off_at_the_end_is_dropped_not_replaced(llama_host):
    tokens = llama_host.tokenize("🐉", add_bos=False)
    assert len(tokens) > 1
    detok = llama_host.detokenizer()
    out = [detok.push(t) for t in tokens[:-1]] + [detok.flush()]
    assert "".join(out) == ""


def test_a_long_text_is_tokenized_in_pieces_that_give_the_same_tokens(llama_host):
    import random


    rng = random.Random(7)
    parts = ["<|im_start|>", "<|im_end|>", "hello", " world", "\n", "  ", "<|endoftext|>", "é", "<|im_", "end|>",
             "x" * 3000, "<|im_start|>" * 3, " \n "]
    cut = 0
    for _ in range(20):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(1, 2000)))
        for bos in (False, True):
            whole = llama_host._model.tokenize(text.encode(), add_bos=bos and llama_host._add_bos, special=True)
            if len(whole) > 1 and whole[0] == whole[1] == llama_host._bos:
                whole = whole[1:]
            assert llama_host.tokenize(text, add_bos=bos) == whole
        cut += len(llama_host._pieces(text)) > 1
    assert cut > 10   # most texts were long enough to be cut


def test_the_longest_token_is_known_so_a_text_that_cannot_fit_is_known_before_tokenizing(llama_host):
    longest = max(len(llama_host._piece(t, True)) for t in range(llama_host.abilities.vocab_size))
    assert llama_host.max_token_bytes == longest and 1 < longest < 256
