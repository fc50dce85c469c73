"""Idle slots' cells kept in host memory (llamacpp/stash.py), on the real embedded model."""

from __future__ import annotations

import threading

import pytest

from openai_ext.hosts.base import Prompt
from openai_ext.hosts.request import GenerationSettings
from tests.support.servers import run_together, wait_until

pytestmark = pytest.mark.slow

# Two texts that share no first token, so the second does not take the first one's slot.
HISTORY = ("The history of the Roman Empire spans many centuries, from the founding of the city to the fall of "
           "the western provinces. Its roads, laws and language shaped the lands around the Mediterranean Sea, and "
           "its emperors ruled")
PLANTS = ("Photosynthesis is the process by which green plants, algae and some bacteria turn light, water and "
          "carbon dioxide into sugar and oxygen. It takes place in the chloroplasts of leaf cells, where")
OCEANS = "Oceans cover most of the surface of the Earth, and their currents carry"


def host(cache_ram_mb: int):
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    # flash attention off: the same request gives the same tokens wherever its cells lie; no
    # speculation: how many tokens a step checks (its sums) does not turn on how fast steps ran
    return LlamaCppHost(default_gguf(), n_ctx=2048, parallel=2, flash_attn="off", speculation="off",
                        cache_ram_mb=cache_ram_mb)


def generate(h, text: str) -> list[str]:
    prompt = Prompt(text, h.tokenize(text))
    return [p.text for p in h.generate(prompt, GenerationSettings(max_new_tokens=16, temperature=0.0),
                                       threading.Event())]


def test_an_idle_slots_cells_leave_the_kv_cache_and_come_back_with_the_same_reply():
    h = host(64)
    try:
        stats = h._sched.stats
        first = generate(h, HISTORY)
        held = h.kv_cells()["used"]
        assert held >= len(h.tokenize(HISTORY)) and stats.stashed == 0
        generate(h, PLANTS)   # takes the other slot: the first one's cells go to host memory
        assert stats.stashed == 1 and h.kv_cells()["used"] < held
        reused = stats.reused_tokens
        again = generate(h, HISTORY)
        assert stats.restored == 1
        assert stats.reused_tokens - reused >= len(h.tokenize(HISTORY)) - 1   # copied back, not read again
        assert again == first
        assert h.describe()["batch"]["stash_sequences"] >= 1   # (the second text's, moved out in turn)
    finally:
        h.close()


def test_idle_cells_that_host_memory_cannot_keep_stay_in_the_cache():
    h = host(0)   # (0: none are moved)
    try:
        stats = h._sched.stats
        first = generate(h, HISTORY)
        held = h.kv_cells()["used"]
        generate(h, PLANTS)
        assert stats.stashed == 0 and h.kv_cells()["used"] > held
        assert "stash_sequences" not in h.describe()["batch"]
    finally:
        h.close()
    tiny = host(1)   # a megabyte: less than the first text's cells
    try:
        stats = tiny._sched.stats
        assert generate(tiny, HISTORY) == first
        held = tiny.kv_cells()["used"]
        generate(tiny, PLANTS)
        assert stats.stashed == 0 and tiny.kv_cells()["used"] > held   # not kept there: left where it was
        reused = stats.reused_tokens
        assert generate(tiny, HISTORY) == first
        assert stats.restored == 0 and stats.reused_tokens - reused >= len(tiny.tokenize(HISTORY)) - 1
    finally:
        tiny.close()


def test_host_memory_keeps_the_most_recent_copies_within_its_size():
    h = host(64)
    try:
        stats, stash = h._sched.stats, h._sched.idle_cells.stash
        assert stash is not None
        generate(h, PLANTS)
        generate(h, HISTORY)   # the first text's cells go to host memory
        assert len(stash) == 1
        idle = next(slot for slot in h._sched.slots if slot.cached)   # the second text's, idle
        stash.budget = stash.bytes + h.runtime.L.llama_state_seq_get_size(h.runtime.ctx, idle.id) - 1
        generate(h, OCEANS)   # the second text's cells go there too: the first's copy makes room
        assert stats.stashed == 2 and len(stash) == 1
        generate(h, PLANTS)
        assert stats.restored == 0   # read again
        generate(h, HISTORY)
        assert stats.restored == 1   # the most recent copy came back
    finally:
        h.close()


def test_a_slot_taken_for_a_shared_start_keeps_the_rest_of_what_it_held_in_host_memory():
    """A newcomer that starts as an idle slot's sequence did (the same system prompt) takes that
    slot and cuts what follows the shared start: that sequence is copied out first, so its own
    next turn is copied back rather than read again."""
    start = "You are a careful historian. Answer in full sentences. "
    h = host(64)
    try:
        stats = h._sched.stats
        first = generate(h, start + HISTORY)
        generate(h, start + PLANTS)   # takes the first one's slot (it holds the shared start)
        assert stats.stashed == 1
        assert generate(h, start + HISTORY) == first
        assert stats.restored == 1
    finally:
        h.close()


def test_while_nothing_runs_idle_cells_go_to_host_memory_and_the_last_used_lie_together():
    """Two sequences decoded together leave their cells interleaved: once both have ended, the
    older one's go to host memory before any newcomer asks (its first token does not wait for the
    copy), the newer one's are moved together, and both give the same replies as they did alone."""
    h = host(64)
    try:
        stats = h._sched.stats
        for text in (HISTORY, PLANTS):
            generate(h, text)
        # each read again from its cells (the last prompt token decoded alone: a prompt read whole
        # sums that token's row with the others, and may come out another way at a near tie)
        alone = {text: generate(h, text) for text in (HISTORY, PLANTS)}
        generate(h, OCEANS)   # (the two texts' cells go to host memory: a clean start)
        stashed, compacted = stats.stashed, stats.compacted
        gate, replies = threading.Barrier(2), {}

        def together(i: int) -> None:
            gate.wait()
            replies[i] = generate(h, (HISTORY, PLANTS)[i])

        run_together(together, 2)
        # (decoded two at a time, a reply may take another turn: llama.cpp sums a batch of two apart)
        assert stats.most_running == 2 and sorted(replies) == [0, 1]
        wait_until(lambda: stats.compacted > compacted, "the last used sequence's cells moved together")
        assert stats.stashed == stashed + 1   # the other one went to host memory, with no newcomer
        held = [slot for slot in h._sched.slots if slot.cached]
        assert len(held) == 1 and h.kv_cells()["used"] == len(held[0].cached)
        last = HISTORY if held[0].cached[:8] == h.tokenize(HISTORY)[:8] else PLANTS
        other = PLANTS if last is HISTORY else HISTORY
        reused, restored = stats.reused_tokens, stats.restored
        assert generate(h, last) == alone[last]   # read from the cells moved together
        assert stats.reused_tokens - reused >= len(h.tokenize(last)) - 1 and stats.restored == restored
        assert generate(h, other) == alone[other]   # copied back from host memory
        assert stats.restored == restored + 1
    finally:
        h.close()
