"""The scripted host keeps the Host contract the real hosts keep (the fast tier's tests rely on it)."""

from __future__ import annotations

import threading

import pytest
from support.scripted import Reply, ScriptedHost, call

from openai_ext.hosts.base import Prompt
from openai_ext.hosts.request import GenerationSettings


def _prompt(host, text="<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"):
    return Prompt(text, host.tokenize(text))


def test_tokens_round_trip_and_specials_are_one_token():
    host = ScriptedHost()
    text = "<|im_start|>user\nHello, world!  Two  spaces.<|im_end|>"
    tokens = host.tokenize(text)
    assert host.detokenize(tokens) == text
    assert host.tokenize("<|im_end|>" * 3) == [2, 2, 2]
    assert host.tokenize("") == [] and host.detokenize(host.document_start()) == "<|endoftext|>"
    assert host.tokenize(" word word") == host.tokenize(" word") * 2


def test_replies_come_in_order_then_the_default():
    host = ScriptedHost(default="fallback text")
    host.script("first reply", "second")
    texts = ["".join(p.text for p in host.generate(_prompt(host), GenerationSettings(max_new_tokens=50), threading.Event()))
             for _ in range(3)]
    assert texts == ["first reply", "second", "fallback text"]
    assert [c.reply.text for c in host.calls] == ["first reply", "second", "fallback text"]


def test_budget_ends_with_length_and_a_whole_reply_with_stop():
    host = ScriptedHost()
    host.script("one two three four", "one two")
    cut = list(host.generate(_prompt(host), GenerationSettings(max_new_tokens=3), threading.Event()))
    assert [p.text for p in cut] == ["one", " two", " three"]
    assert [p.finish_reason for p in cut] == [None, None, "length"]
    whole = list(host.generate(_prompt(host), GenerationSettings(max_new_tokens=3), threading.Event()))
    assert whole[-1].finish_reason == "stop" and sum(p.tokens for p in whole) == 2
    none = list(host.generate(_prompt(host), GenerationSettings(max_new_tokens=0), threading.Event()))
    assert [(p.text, p.tokens, p.finish_reason) for p in none] == [("", 0, "length")]


def test_stop_event_ends_the_reply_between_tokens():
    host = ScriptedHost()
    stop = threading.Event()
    pieces = host.generate(_prompt(host), GenerationSettings(max_new_tokens=50), stop)
    assert next(pieces).text == "Hello"
    stop.set()
    assert list(pieces) == []
    assert host.idle()


def test_logprobs_when_asked_the_sampled_token_first():
    host = ScriptedHost()
    host.script("a b")
    pieces = list(host.generate(_prompt(host), GenerationSettings(max_new_tokens=5, logprobs=3), threading.Event()))
    for p in pieces:
        assert p.logprob.token == p.text and p.logprob.logprob <= 0 and len(p.logprob.top) == 3
        assert p.logprob.top[0][0] == p.text and bytes(p.logprob.bytes).decode() == p.text
    plain = list(host.generate(_prompt(host), GenerationSettings(max_new_tokens=5), threading.Event()))
    assert all(p.logprob is None for p in plain)


def test_a_reply_continues_a_prefilled_prompt():
    host = ScriptedHost()
    reply = call("get_weather", {"city": "Paris"})
    prefill = '<tool_call>\n{"name": "get_weather", "arguments": '
    host.script(reply)
    text = "".join(p.text for p in host.generate(_prompt(host, "...assistant\n" + prefill), GenerationSettings(max_new_tokens=99),
                                                 threading.Event()))
    assert prefill + text == reply


def test_a_gated_reply_waits_and_a_failing_one_raises():
    host = ScriptedHost()
    gate = threading.Event()
    held, failing = host.script(Reply("a b c", gate=gate, gate_at=1), Reply("a b c", fail_after=2))
    pieces = host.generate(_prompt(host), GenerationSettings(max_new_tokens=9), threading.Event())
    assert next(pieces).text == "a" and held.started.is_set() and not host.idle()
    gate.set()
    assert [p.text for p in pieces] == [" b", " c"] and held.ended.is_set() and host.idle()
    out = []
    with pytest.raises(RuntimeError, match="simulated failure"):
        for p in host.generate(_prompt(host), GenerationSettings(max_new_tokens=9), threading.Event()):
            out.append(p.text)
    assert out == ["a", " b"] and failing.ended.is_set()
