"""Speculative decoding with a draft model (llamacpp/draft.py) on the real model. The draft model
here is the embedded model itself: the only GGUF the tests have, and one whose guesses the model
accepts wherever the two agree, so drafts are made and accepted on any prompt, not only where
text repeats (the tests check that they were). It changes no answer, only how many steps it takes."""

from __future__ import annotations

import pytest
from support.servers import openai_client
from support.spec import assert_valid
from test_batching import GREEDY, assert_same_greedy_answer, generate, in_thread
from test_speculation import answers_and_steps, drafts

pytestmark = pytest.mark.slow

# A prompt with no text to repeat: prompt lookup finds nothing to draft, the draft model does.
STORY = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def make_host(parallel: int, speculation: str = "ngram", draft=None):
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    return LlamaCppHost(default_gguf(), n_ctx=4096, parallel=parallel, speculation=speculation,
                        draft_model=draft or default_gguf(), whole_drafts=True)


@pytest.fixture(scope="module")
def hosts():
    """The same model without speculation and with the draft model, one sequence each."""
    made = {"off": make_host(1, "off"), "draft": make_host(1)}
    yield made
    for host in made.values():
        host.close()


@pytest.fixture(scope="module")
def draft_host():
    host = make_host(3)
    yield host
    host.close()


def test_a_greedy_answer_is_the_same_with_a_draft_model_in_fewer_steps(hosts):
    settings = GREEDY.replace(max_new_tokens=200, logprobs=2, samplers={"ban_eos_token": True})
    answers, steps = answers_and_steps(hosts, STORY, settings)
    drafted, accepted = drafts(hosts["draft"])
    assert accepted > 0 and drafted >= accepted and hosts["off"].drafter is None
    assert_same_greedy_answer(answers["off"], answers["draft"])
    assert len(answers["draft"]) == 200 and all(p.tokens == 1 for p in answers["draft"])
    assert steps["draft"] < steps["off"]
    info = hosts["draft"].describe()["speculation"]
    assert info["mode"] == "draft" and info["draft_model"].endswith(".gguf")
    assert info["draft_max"] == 16   # (each drafted token costs the draft model a step)
    assert info["recent"][-1]["tokens"] == 200 and 0 < info["recent"][-1]["accepted"] <= info["recent"][-1]["drafted"]


def test_a_seeded_sampled_answer_is_drawn_the_same_way_with_a_draft_model(hosts):
    """Each token is drawn from the model's own distribution with the same draws of the seeded
    generator. A step that checks a draft sums in another order, so the logits differ in their
    last bits, and a draw that falls on the edge between two tokens may take the other one: the
    answers are the same up to there, and there each took a token the other run found likely too."""
    settings = GREEDY.replace(temperature=0.8, top_p=0.95, seed=7, max_new_tokens=100, logprobs=5,
                              samplers={"ban_eos_token": True})
    before = drafts(hosts["draft"])
    off, on = (generate(hosts[m], STORY, settings) for m in ("off", "draft"))
    assert drafts(hosts["draft"])[1] > before[1]
    assert len(off) == len(on) == 100
    for a, b in zip(off, on, strict=True):
        if a.text != b.text:
            assert b.text in [t for t, *_ in a.logprob.top] and a.text in [t for t, *_ in b.logprob.top], (a, b)
            break


def test_the_budget_stops_a_generation_inside_an_accepted_draft(hosts):
    for budget in (1, 2, 29):
        pieces = generate(hosts["draft"], STORY, GREEDY.replace(max_new_tokens=budget, samplers={"ban_eos_token": True}))
        assert sum(p.tokens for p in pieces) == budget and pieces[-1].finish_reason == "length"


def test_sequences_drafting_together_each_get_their_own_answer(draft_host):
    """The draft model keeps a sequence per slot: each stream's guesses come from its own tokens,
    a slot taken over by another request drops what the last one left, and a request that shares
    a prefix with the last one in its slot reads only the rest."""
    settings = GREEDY.replace(max_new_tokens=80, logprobs=2, samplers={"ban_eos_token": True})
    texts = [f"Write a short poem about {w}." for w in ("the sea", "a clock", "bread", "winter")]
    alone = [generate(draft_host, t, settings) for t in texts]
    before = drafts(draft_host)
    together = [in_thread(generate, draft_host, t, settings) for t in texts]
    for a, t in zip(alone, together, strict=True):
        assert_same_greedy_answer(a, t.result())
    assert drafts(draft_host)[1] > before[1]


def test_features_work_with_a_draft_model_through_the_api(draft_host, make_server):
    client = openai_client(make_server(draft_host))
    first = client.chat.completions.create(model="x", temperature=0, max_tokens=60,
                                           messages=[{"role": "user", "content": STORY}])
    words = first.choices[0].message.content.split()
    stop = " ".join(words[5:7])   # a stop string the answer reaches: it ends before it
    for stream in (False, True):
        if stream:
            chunks = list(client.chat.completions.create(model="x", temperature=0, max_tokens=60, stop=[stop],
                                                         stream=True, messages=[{"role": "user", "content": STORY}]))
            for chunk in chunks:
                assert_valid("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = client.chat.completions.create(model="x", temperature=0, max_tokens=60, stop=[stop],
                                                   messages=[{"role": "user", "content": STORY}])
            assert_valid("CreateChatCompletionResponse", reply.model_dump(mode="json", exclude_unset=True))
            text = reply.choices[0].message.content
        assert stop not in text and first.choices[0].message.content.startswith(text)
    reply = client.chat.completions.create(model="x", temperature=0, max_tokens=50, logprobs=True, top_logprobs=2,
                                           messages=[{"role": "user", "content": STORY}],
                                           extra_body={"ban_eos_token": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 50
    assert "".join(t.token for t in content) == reply.choices[0].message.content


def test_a_draft_model_of_another_vocabulary_is_refused(tmp_path):
    """A GGUF whose end token is another token (here the embedded model's own file with that one
    field changed) cannot draft for the model: the load stops with the reason."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    from openai_ext.hosts.files import default_gguf

    other = tmp_path / "other-family.gguf"
    reader = gguf.GGUFReader(default_gguf())
    writer = gguf.GGUFWriter(other, arch=reader.get_field(gguf.Keys.General.ARCHITECTURE).contents(),
                             endianess=reader.endianess)
    eos = reader.get_field(gguf.Keys.Tokenizer.EOS_ID).contents()
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.EOS_ID: MetadataDetails(
        gguf.GGUFValueType.UINT32, eos + 1)}, [])
    with pytest.raises(ValueError, match="cannot draft for this model: its start and end tokens"):
        make_host(1, draft=other)


def test_a_long_prompt_is_read_by_the_draft_model_over_several_steps(hosts):
    """A prompt longer than the draft model reads in one step (draft.CATCH_UP): it drafts once it
    has caught up, and the answer is the one without it."""
    from openai_ext.hosts.llamacpp.draft import CATCH_UP

    text = "Here are some notes.\n" + "\n".join(f"Note {i}: the {w} was seen at {i} o'clock." for i, w in
                                               enumerate(["cat", "owl", "fox", "elk", "bee"] * 14)) + "\n" + STORY
    assert len(hosts["draft"].tokenize(text)) > 2 * CATCH_UP
    settings = GREEDY.replace(max_new_tokens=60, logprobs=2, samplers={"ban_eos_token": True})
    before = drafts(hosts["draft"])
    off, on = (generate(hosts[m], text, settings) for m in ("off", "draft"))
    assert drafts(hosts["draft"])[1] > before[1]
    assert_same_greedy_answer(off, on)
