"""Speculative decoding in the embedded host (prompt lookup, llamacpp/speculate.py) on the real
model: it changes no answer, only how many steps it takes, and every feature of a generation
works with it on. The prompts make the model repeat text it was given, as an agent quoting a
file does, so drafts are made and accepted (the tests check that they were)."""

from __future__ import annotations

import json

import pytest
from support.servers import openai_client
from support.spec import assert_valid
from test_batching import GREEDY, assert_same_greedy_answer, generate, in_thread

from openai_ext.hosts.llamacpp.plan import StepCost

pytestmark = pytest.mark.slow

CODE = "\n".join(f"def function_{i}(x):\n    return x * {i} + {i * 7}\n" for i in range(30))
REPEAT = f"Repeat this code exactly:\n{CODE}"


def make_host(speculation: str, parallel: int):
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    # (drafts checked whole: on a CPU where they would not pay they are cut, and here they are the subject)
    return LlamaCppHost(default_gguf(), n_ctx=4096, parallel=parallel, speculation=speculation, whole_drafts=True)


@pytest.fixture(scope="module")
def hosts():
    """The same model with and without speculation, one sequence each (the reproducible path)."""
    made = {mode: make_host(mode, 1) for mode in ("off", "ngram")}
    yield made
    for host in made.values():
        host.close()


@pytest.fixture(scope="module")
def spec_host():
    host = make_host("ngram", 4)
    yield host
    host.close()


@pytest.fixture(scope="module")
def spec_server(spec_host, make_server):
    return make_server(spec_host)


def drafts(host) -> tuple[int, int]:
    stats = host.batch_stats()
    return stats["drafted"], stats["accepted"]


def answers_and_steps(hosts: dict, text: str, settings) -> tuple[dict, dict]:
    """Each host's answer to ``text`` and the steps it took."""
    answers, steps = {}, {}
    for mode, host in hosts.items():
        before = host.batch_stats()["steps"]
        answers[mode] = generate(host, text, settings)
        steps[mode] = host.batch_stats()["steps"] - before
    return answers, steps


def test_a_greedy_answer_is_the_same_with_speculation_in_fewer_steps(hosts):
    settings = GREEDY.replace(max_new_tokens=300, logprobs=2, samplers={"ban_eos_token": True})
    answers, steps = answers_and_steps(hosts, REPEAT, settings)
    drafted, accepted = drafts(hosts["ngram"])
    assert drafts(hosts["off"]) == (0, 0) and accepted > 0 and drafted >= accepted
    # Token for token, each with its log-probability; a drafted token is checked in a step of
    # several tokens, whose sums run in another order, so (as beside other sequences) a near tie
    # between the two best tokens may go the other way (test_batching.assert_same_greedy_answer).
    assert_same_greedy_answer(answers["off"], answers["ngram"])
    assert len(answers["ngram"]) == 300 and all(p.tokens == 1 for p in answers["ngram"])
    assert steps["ngram"] < steps["off"]
    speculation = hosts["ngram"].describe()["speculation"]
    recent = speculation["recent"][-1]
    assert recent["tokens"] == 300 and 0 < recent["accepted"] <= recent["drafted"]
    # prompt lookup's drafts cost nothing to make: they run to a step of plan.TILED tokens
    assert speculation["draft_max"] == 63


def test_a_seeded_sampled_answer_is_drawn_the_same_way_with_speculation(hosts):
    """Each token is still drawn from the model's distribution given the tokens before it, with
    the same draws of the seeded generator: the same text where the logits agree."""
    settings = GREEDY.replace(temperature=0.7, top_p=0.9, seed=42, max_new_tokens=120, logprobs=2,
                              samplers={"ban_eos_token": True})
    before = drafts(hosts["ngram"])
    off, on = (generate(hosts[m], REPEAT, settings) for m in ("off", "ngram"))
    assert drafts(hosts["ngram"])[1] > before[1]
    assert_same_greedy_answer(off, on, tie=1.0)


def test_the_budget_stops_a_generation_inside_an_accepted_draft(hosts):
    host = hosts["ngram"]
    for budget in (1, 2, 37):
        pieces = generate(host, REPEAT, GREEDY.replace(max_new_tokens=budget, samplers={"ban_eos_token": True}))
        assert sum(p.tokens for p in pieces) == budget and pieces[-1].finish_reason == "length"


def test_features_work_with_speculation_on_in_the_batch(spec_server, spec_host):
    client = openai_client(spec_server)
    before = drafts(spec_host)
    # a stop string inside text the model repeats: the output ends before it, streamed or not
    stop = "function_3("
    reply = client.chat.completions.create(model="x", temperature=0, max_tokens=300, stop=[stop],
                                           messages=[{"role": "user", "content": REPEAT}])
    assert_valid("CreateChatCompletionResponse", reply.model_dump(mode="json", exclude_unset=True))
    text = reply.choices[0].message.content
    assert stop not in text and reply.choices[0].finish_reason == "stop" and "function_2(" in text
    chunks = list(client.chat.completions.create(model="x", temperature=0, max_tokens=300, stop=[stop], stream=True,
                                                 messages=[{"role": "user", "content": REPEAT}]))
    for chunk in chunks:
        assert_valid("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert stop not in streamed and "function_2(" in streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    # log-probabilities: one per token, as many as the usage counts
    reply = client.chat.completions.create(model="x", temperature=0, max_tokens=120, logprobs=True, top_logprobs=2,
                                           messages=[{"role": "user", "content": REPEAT}],
                                           extra_body={"ban_eos_token": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 120
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    # a JSON schema (the grammar steps each drafted token) and several choices at once
    schema = {"type": "object", "properties": {"lines": {"type": "array", "items": {"type": "string"}}},
              "required": ["lines"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model="x", temperature=0, max_tokens=200, n=2,
        messages=[{"role": "user", "content": f"Put each line of this code in a JSON list:\n{CODE[:400]}"}],
        response_format={"type": "json_schema", "json_schema": {"name": "lines", "schema": schema, "strict": True}})
    for choice in reply.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content)["lines"], list)
    assert drafts(spec_host)[1] > before[1]


def test_streams_that_speculate_beside_others_each_get_their_own_answer(spec_host):
    settings = GREEDY.replace(max_new_tokens=120, logprobs=2, samplers={"ban_eos_token": True})
    texts = ["Repeat this list exactly:\n" + "\n".join(f"- {w} number {i}" for i in range(25))
             for w in ("apple", "river", "candle")]
    alone = [generate(spec_host, t, settings) for t in texts]
    together = [in_thread(generate, spec_host, t, settings) for t in texts]
    for a, t in zip(alone, together, strict=True):
        assert_same_greedy_answer(a, t.result())


def test_a_bad_speculation_setting_is_refused():
    with pytest.raises(ValueError, match="ngram or off"):
        make_host("draft", 1)


def test_the_setting_turns_it_off(make_server):
    host = make_host("off", 2)
    try:
        client = openai_client(make_server(host))
        reply = client.chat.completions.create(model="x", temperature=0, max_tokens=60,
                                               messages=[{"role": "user", "content": REPEAT}])
        assert reply.usage.completion_tokens == 60 or reply.choices[0].finish_reason == "stop"
        assert drafts(host) == (0, 0) and host.describe()["speculation"]["mode"] == "off"
    finally:
        host.close()


class NeverPays(StepCost):
    """Step times that say a drafted token always costs more than it can save."""

    def fitted(self, tokens=1):
        return (0.0, 1.0, 0.0)


def test_on_one_sequence_drafts_are_checked_whole_whatever_the_step_times_say():
    """One sequence is the reproducible path: what a step checks must not depend on how long
    earlier steps took, so the pays-check (which follows the step times) leaves its drafts whole.
    With several sequences the same times cut them, to the one-token probe that one draft in
    PROBE_EVERY still gets (so a sequence learns its rate)."""
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.hosts.llamacpp.speculate import PROBE_EVERY

    settings = GREEDY.replace(max_new_tokens=60, samplers={"ban_eos_token": True})
    counts = {}
    for parallel in (1, 2):
        host = LlamaCppHost(default_gguf(), n_ctx=4096, parallel=parallel)
        try:
            host._sched.cost = NeverPays()
            generate(host, REPEAT, settings)
            counts[parallel] = drafts(host)[0]
        finally:
            host.close()
    assert counts[1] > 0 and 0 < counts[2] <= 60 // PROBE_EVERY + 1 and counts[2] < counts[1]
