"""A Realtime conversation longer than the context (respond._prepare_within_context, on text.fitting):
its oldest turns are left out, the instructions stay, what is kept starts at a user message, the
cut stays put while the next turns come, and tokens are cut only as the setting's last resort."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from openai_ext.core.errors import ContextLengthExceeded
from openai_ext.realtime import respond
from openai_ext.text.protocol import ChatCompletionRequest


def conversation(turns: int) -> ChatCompletionRequest:
    messages = [{"role": "system", "content": "Be brief."}]
    for n in range(turns):
        messages += [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]
    return ChatCompletionRequest(model="m", messages=messages[:-1])   # ends on the newest question


@pytest.fixture
def prepared(monkeypatch):
    """chat.prepare as a context of ``room`` messages: the messages it was given, and every try."""
    tries: list[tuple[int, bool]] = []

    def prepare(text, req, *, truncate):
        tries.append((len(req.messages), truncate))
        if len(req.messages) > text.room and not truncate:
            raise ContextLengthExceeded(f"{len(req.messages)} messages do not fit", param="messages")
        return [m.content for m in req.messages]

    monkeypatch.setattr(respond.chat, "prepare", prepare)
    return tries


def text(room: int, truncate_prompt: bool = False) -> SimpleNamespace:
    return SimpleNamespace(room=room, settings=SimpleNamespace(truncate_prompt=truncate_prompt))


def test_a_conversation_that_fits_is_sent_whole_in_one_try(prepared):
    assert respond._prepare_within_context(text(100), conversation(5)) == [
        "Be brief.", "q0", "a0", "q1", "a1", "q2", "a2", "q3", "a3", "q4"]
    assert prepared == [(10, False)]


def test_the_oldest_turns_go_the_instructions_stay_and_the_cut_stays_put(prepared):
    kept = []
    for turns in range(30, 50):   # 20 turns fit; a quarter of them is 5, so the cut moves by 4
        got = respond._prepare_within_context(text(41), conversation(turns))
        assert got[0] == "Be brief." and got[1].startswith("q") and got[-1] == f"q{turns - 1}" and len(got) <= 41
        kept.append(got[1])
    assert sum(a != b for a, b in itertools.pairwise(kept)) <= len(kept) // 4 + 1, kept   # not a new beginning each turn
    assert len(prepared) < 20 * 9   # a few tries a turn, not one per turn left out


def test_tokens_are_cut_only_where_even_the_newest_turn_does_not_fit(prepared):
    with pytest.raises(ContextLengthExceeded, match="2 messages do not fit"):
        respond._prepare_within_context(text(1), conversation(6))
    prepared.clear()
    assert respond._prepare_within_context(text(1, truncate_prompt=True), conversation(6)) == ["Be brief.", "q5"]
    assert prepared[-1] == (2, True) and all(not truncate for _, truncate in prepared[:-1])
    prepared.clear()   # the setting on, and turns that fit: turns are left out, no token is cut
    assert respond._prepare_within_context(text(5, truncate_prompt=True), conversation(6))[1] in ("q4", "q5")
    assert all(not truncate for _, truncate in prepared)
