"""What one step of the embedded host's batch decodes (llamacpp/plan.py) and what a sequence
drafts for it (llamacpp/speculate.py), on works that stand for sequences."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from openai_ext.hosts.llamacpp.plan import (
    LEAST_READ,
    SHORT_PROMPT,
    STEP_FIRST,
    STEP_GENERATING,
    STEP_READING,
    TILED,
    LinearCost,
    StepCost,
    attended,
    nonnegative_fit,
    plan_step,
)
from openai_ext.hosts.llamacpp.speculate import MAX_SKIP, PROBE_EVERY, ModelDraft, PromptLookup, Tally


class Seq:
    """A running sequence as the plan sees it: ``left`` tokens to decode (1: generating)."""

    def __init__(self, slot: int, order: int, left: int, draft: list[int] | None = None, ready: bool = True,
                 acceptance: float = 0.5, background: bool = False):
        self.slot, self.order = SimpleNamespace(id=slot), order
        self.background = background
        self.rate = acceptance
        self.tokens = [1] * (10 + left)
        self.n_past = 10
        self.media = None
        self._draft, self._ready = draft or [], ready
        self.pace = None

    def end(self) -> int:
        return len(self.tokens)

    def ready(self) -> bool:
        return self._ready

    def draft(self, limit: int, reach: bool = False) -> list[int]:
        return self._draft[:limit]

    def chances(self, n: int) -> np.ndarray:
        return self.rate ** np.arange(1, n + 1)

    def probe(self) -> bool:
        return self.pace.probe() if self.pace is not None else False


def shares(parts) -> dict[int, tuple[int, int]]:
    return {p.work.slot.id: (p.count, len(p.draft)) for p in parts}


def test_a_short_prompt_is_read_before_long_ones_that_came_first():
    long1, long2 = Seq(0, 1, 6000), Seq(1, 2, 6000)
    short = Seq(2, 3, 12)
    parts = plan_step([long1, long2, short], n_batch=512, prefill_chunk=128, free_cells=8000)
    got = shares(parts)
    assert got[2] == (12, 0)                         # the whole short prompt, this step
    assert got[0] == (500, 0) and 1 not in got       # the rest to the oldest long one
    assert [p.first for p in parts] == [0, 500]      # in slot order, one after the other


def test_long_prompts_are_read_first_come_first_served_and_never_stall_the_generating():
    gen = [Seq(i, i, 1) for i in range(3)]
    long1, long2 = Seq(3, 10, SHORT_PROMPT + 1), Seq(4, 11, 5000)
    got = shares(plan_step(gen + [long2, long1], n_batch=512, prefill_chunk=128, free_cells=8000))
    assert all(got[i] == (1, 0) for i in range(3))   # a token for each generating sequence
    assert got[3] == (125, 0) and 4 not in got       # a chunk of what remains, to the first to come


def test_a_prompt_always_gets_a_least_share_beside_many_generating():
    gen = [Seq(i, i, 1) for i in range(200)]
    got = shares(plan_step(gen + [Seq(200, 300, 4000)], n_batch=512, prefill_chunk=128, free_cells=8000))
    assert got[200] == (LEAST_READ, 0)


def test_drafts_ride_with_their_sequence_within_the_batch_and_the_cells():
    drafting = Seq(0, 1, 1, draft=[5, 6, 7, 8])
    other = Seq(1, 2, 1, draft=[9, 9])
    got = shares(plan_step([drafting, other], n_batch=512, prefill_chunk=128, free_cells=8000))
    assert got == {0: (5, 4), 1: (3, 2)}
    # a full cache: each sequence its own token first, drafts only in what is left
    got = shares(plan_step([drafting, other], n_batch=512, prefill_chunk=128, free_cells=4))
    assert got == {0: (3, 2), 1: (1, 0)}
    # a prompt being read keeps its least share: drafts take only what lies beyond it
    reader = Seq(2, 3, 1000)
    got = shares(plan_step([drafting, reader], n_batch=1 + LEAST_READ + 2, prefill_chunk=128, free_cells=8000))
    assert got == {0: (3, 2), 2: (LEAST_READ, 0)}


def test_a_sequence_whose_reader_is_behind_sits_out_the_step():
    got = shares(plan_step([Seq(0, 1, 1, ready=False), Seq(1, 2, 1)], n_batch=512, prefill_chunk=128,
                           free_cells=100))
    assert got == {1: (1, 0)}


def test_prompt_lookup_drafts_what_followed_the_last_place_of_the_last_three_tokens():
    lookup = PromptLookup(most=4)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    assert lookup.draft(tokens, 10) == [4, 5, 6, 7]          # at most ``most``
    assert lookup.draft(tokens, 2) == [4, 5]                 # and at most what the step allows
    tokens += [4, 9, 9, 1, 2, 3]
    assert lookup.draft(tokens, 10) == [4, 9, 9, 1]          # the latest place, from the index kept
    assert PromptLookup(4).draft([1, 2, 3, 4, 5], 10) == []  # nothing repeats
    assert PromptLookup(4).draft([1, 2], 10) == []


def test_a_draft_stops_before_an_image():
    tokens = [1, 2, 3, 4, -7, -7, 5, 1, 2, 3]
    assert PromptLookup(8).draft(tokens, 10) == [4]


def test_drafts_that_miss_pause_drafting_longer_each_time_and_a_hit_ends_the_pause():
    tally = Tally()
    lookup = PromptLookup(most=4, tally=tally)
    tokens = [1, 2, 3, 4, 1, 2, 3]
    skipped = []
    for _ in range(6):
        assert lookup.draft(tokens, 10)
        lookup.checked(4, 0)
        n = 0
        while not lookup.draft(tokens, 10):   # (the draft that ends the pause is left unchecked)
            n += 1
        skipped.append(n)
    assert skipped == [1, 2, 4, 8, 16, MAX_SKIP]
    lookup.checked(4, 2)
    assert lookup.draft(tokens, 10)                           # drafting again at once
    lookup.finished(20)
    assert tally.recent() == [{"tokens": 20, "drafted": 28, "accepted": 2}]


def test_a_draft_grows_while_it_is_all_accepted_and_shrinks_to_the_run_that_was():
    lookup = PromptLookup(most=16)
    tokens = list(range(40)) + list(range(3))          # what follows 0 1 2 is 3 4 5 ...
    assert len(lookup.draft(tokens, 64)) == 4          # the first draft is short
    lookup.checked(4, 4)
    assert len(lookup.draft(tokens, 64)) == 8          # all accepted: twice as long
    lookup.checked(8, 8)
    assert len(lookup.draft(tokens, 64)) == 16         # up to ``most``
    lookup.checked(16, 16)
    assert len(lookup.draft(tokens, 64)) == 16
    lookup.checked(16, 2)
    assert len(lookup.draft(tokens, 64)) == 3          # the run that was accepted, and one more


def timed_cost(fixed: float, per_token: float, per_cell: float) -> StepCost:
    """A cost model fitted to steps that took exactly what these coefficients say."""
    cost = StepCost()
    for tokens, at in [(512, 0), (128, 600), (17, 3000), (1, 5000), (64, 100), (9, 4000), (200, 2000), (1, 40)]:
        cells = attended(at, tokens)
        cost.add(tokens, cells, fixed + per_token * tokens + per_cell * cells)
    return cost


def test_step_cost_recovers_what_steps_cost_and_never_a_negative_cost():
    cost = timed_cost(0.01, 0.002, 1e-6)
    assert cost.ready()
    assert abs(cost.predict(100, attended(1000, 100)) - (0.01 + 0.2 + 1e-6 * attended(1000, 100))) < 1e-6
    assert StepCost().chunk(1.0, 0) is None and not StepCost().ready()
    fit = nonnegative_fit(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]), np.array([3.0, 2.0, 1.0]))
    assert fit[1] == 0.0 and fit[0] > 0         # a falling line is no cost that falls with tokens


def test_step_cost_is_fitted_again_after_refit_seconds_of_steps_not_after_each():
    """A fit costs a fraction of a millisecond: steps of a few milliseconds (one stream) are
    fitted again only once they add up to REFIT_SECONDS; one long step (a prompt read) at once."""
    cost = timed_cost(0.01, 0.002, 1e-6)
    first = cost.fitted()
    assert first is not None
    short = int(LinearCost.REFIT_SECONDS / 0.004) - 1
    for _ in range(short):   # steps that would move the fit (each took a third of what it says)
        cost.add(1, attended(40, 1), 0.004)
    assert cost.fitted() is first
    cost.add(1, attended(40, 1), 0.004)
    assert cost.fitted() != first
    settled = cost.fitted()
    large = cost.fitted(400)
    cost.add(400, attended(2000, 400), 0.01 + 0.8 + 1e-6 * attended(2000, 400) * 2)
    assert cost.fitted(400) != large and cost.fitted() is settled   # (each kind of step is fitted apart)


def test_deep_into_a_long_prompt_a_step_reads_fewer_tokens_beside_a_stream():
    cost = timed_cost(0.005, 0.001, 1e-6)
    stream = Seq(0, 1, 1)
    shallow, deep = Seq(1, 2, 6000), Seq(1, 2, 6000)
    deep.n_past = 5000
    deep.tokens = [1] * 11000
    near = shares(plan_step([stream, shallow], n_batch=512, prefill_chunk=128, free_cells=30000, cost=cost))[1][0]
    far = shares(plan_step([stream, deep], n_batch=512, prefill_chunk=128, free_cells=30000, cost=cost))[1][0]
    assert 64 <= far < near <= 127
    # the step's predicted time stays within what a step beside a stream may take
    assert cost.predict(1 + far, attended(0, 1) + attended(5000, far)) <= STEP_GENERATING + 1e-9
    # a short prompt is read as far as the tokens allow, whatever the time
    short = Seq(2, 3, 200)
    short.n_past, short.tokens = 8000, [1] * 8200
    assert shares(plan_step([stream, short], n_batch=512, prefill_chunk=128, free_cells=30000, cost=cost))[2][0] == 127


def test_a_step_that_reads_a_newcomers_prompt_is_short_so_its_first_token_comes_soon():
    """Four long prompts read, nothing generating: a step may take STEP_READING. A chat that
    comes (a live short prompt) is read whole in the next step, and the long prompts' share of
    that step shrinks so it takes STEP_FIRST: the chat's first token waits for it."""
    cost = timed_cost(0.005, 0.001, 1e-6)
    longs = [Seq(i, i + 1, 6000) for i in range(4)]
    for seq in longs:
        seq.n_past, seq.tokens = 2000, [1] * 8000

    def step_time(parts):
        return cost.predict(sum(p.count for p in parts), sum(attended(p.work.n_past, p.count) for p in parts))

    alone = plan_step(longs, n_batch=512, prefill_chunk=128, free_cells=30000, cost=cost)
    chat = Seq(4, 5, 30)
    beside = plan_step([*longs, chat], n_batch=512, prefill_chunk=128, free_cells=30000, cost=cost)
    assert shares(beside)[4] == (30, 0)   # the chat's whole prompt
    assert STEP_FIRST < step_time(alone) <= STEP_READING + 1e-9
    assert step_time(beside) <= STEP_FIRST + 1e-9
    assert sum(n for slot, (n, _) in shares(beside).items() if slot < 4) < sum(n for n, _ in shares(alone).values())
    # a batch's line (background work) is no newcomer: no one waits for its first token
    line = Seq(4, 5, 30, background=True)
    assert step_time(plan_step([*longs, line], n_batch=512, prefill_chunk=128, free_cells=30000, cost=cost)) \
        > STEP_FIRST


def test_deep_in_a_long_prompt_a_step_moves_it_by_the_least_share_not_by_a_fixed_chunk():
    """Where a token deep in a prompt costs a good part of a step's time, the first long prompt
    still moves on every step, by LEAST_READ tokens, not by a chunk that would take seconds."""
    cost = timed_cost(0.005, 0.001, 2e-6)
    deep = Seq(0, 1, 30000)
    deep.n_past, deep.tokens = 20000, [1] * 50000
    took = shares(plan_step([deep], n_batch=512, prefill_chunk=128, free_cells=60000, cost=cost))[0][0]
    assert took == LEAST_READ   # (at 40 ms a token, the half second holds fewer)


def test_a_draft_is_checked_as_far_as_it_pays_for_the_time_it_adds():
    def drafted(cost, rate, whole=False):
        seq = Seq(0, 1, 1, draft=list(range(8)), acceptance=rate)
        parts = plan_step([seq], n_batch=512, prefill_chunk=128, free_cells=8000, cost=cost, whole_drafts=whole)
        return len(parts[0].draft)

    # a step's fixed cost rules (a GPU): checking drafted tokens costs next to nothing
    gpu = timed_cost(0.02, 0.0001, 1e-9)
    assert drafted(gpu, 0.9) == 8 and drafted(gpu, 0.5) >= 6
    # each token costs nearly what a step does (a CPU): only a draft that is nearly always
    # accepted pays, and then only its first tokens, whose chance is highest
    cpu = timed_cost(0.002, 0.006, 1e-7)
    assert drafted(cpu, 0.5) == 0
    assert 0 < drafted(cpu, 0.9) < 8 and drafted(cpu, 0.99) == 8
    assert drafted(cpu, 0.5, whole=True) == 8
    # until steps are timed, a draft is checked whole
    assert drafted(StepCost(), 0.1) == 8


def two_kinds_cost(small_cell: float, large_cell: float) -> StepCost:
    """A cost model fitted to steps whose attention costs ``small_cell`` a cell below TILED
    tokens and ``large_cell`` from TILED on (llama.cpp's flash attention on the CPU)."""
    cost = StepCost()
    for tokens, at in [(512, 0), (128, 600), (64, 3000), (200, 2000), (17, 3000), (1, 5000), (9, 4000), (1, 40)]:
        cells = attended(at, tokens)
        cost.add(tokens, cells, 0.002 + 0.0005 * tokens + (large_cell if tokens >= TILED else small_cell) * cells)
    return cost


def test_a_draft_is_checked_to_the_tiled_step_where_that_step_costs_less_than_a_shorter_one():
    """Deep in a long context on a CPU, a step of 64 tokens takes less time than one of 48: a
    draft that pays only a few tokens deep in a short step is checked whole where it makes the
    step TILED tokens long, and cut as before where both kinds of step cost alike."""
    def drafted(cost):
        seq = Seq(0, 1, 1, draft=list(range(TILED - 1)), acceptance=0.97)
        seq.n_past, seq.tokens = 4000, [1] * 4001
        parts = plan_step([seq], n_batch=512, prefill_chunk=128, free_cells=8000, cost=cost)
        return len(parts[0].draft)

    tiled = two_kinds_cost(3.3e-6, 1.2e-6)
    assert tiled.predict(TILED, attended(4000, TILED)) < tiled.predict(48, attended(4000, 48))
    assert drafted(tiled) == TILED - 1
    assert 0 < drafted(two_kinds_cost(3.3e-6, 3.3e-6)) < 16


def test_a_draft_the_step_cuts_to_what_pays_may_hold_the_most_tokens():
    """The length rule (a run accepted and one more, doubled) is for drafts checked whole; where
    the step's pays-check weighs each drafted token's chance against its cost, a draft may hold
    ``most`` tokens, and the step asks for that only then."""
    lookup = PromptLookup(most=16)
    tokens = list(range(40)) + list(range(3))
    assert len(lookup.draft(tokens, 64)) == 4
    assert len(lookup.draft(tokens, 64, reach=True)) == 16
    assert len(lookup.draft(tokens, 10, reach=True)) == 10

    asked = []

    class Asking(Seq):
        def draft(self, limit, reach=False):
            asked.append(reach)
            return []

    seq = Asking(0, 1, 1)
    for cost, whole in [(timed_cost(0.002, 0.006, 1e-7), False), (timed_cost(0.002, 0.006, 1e-7), True),
                        (StepCost(), False)]:
        plan_step([seq], n_batch=512, prefill_chunk=128, free_cells=8000, cost=cost, whole_drafts=whole)
    assert asked == [True, False, False]


def test_a_long_prompts_chunk_beside_a_stream_fills_the_step_to_the_tiled_kind_where_that_fits():
    """A chunk deep in a long prompt: where a step of TILED tokens fits the time a step beside a
    stream may take and a step of fewer is no cheaper, the step holds TILED tokens or more."""
    stream = Seq(0, 1, 1)
    deep = Seq(1, 2, 6000)
    deep.n_past, deep.tokens = 3000, [1] * 9000
    tiled = two_kinds_cost(3.3e-6, 1.2e-6)
    took = shares(plan_step([stream, deep], n_batch=512, prefill_chunk=128, free_cells=30000, cost=tiled))[1][0]
    assert 1 + took >= TILED
    assert tiled.predict(1 + took, attended(stream.n_past, 1) + attended(3000, took)) <= STEP_GENERATING + 1e-9
    alike = two_kinds_cost(3.3e-6, 3.3e-6)
    took = shares(plan_step([stream, deep], n_batch=512, prefill_chunk=128, free_cells=30000, cost=alike))[1][0]
    assert LEAST_READ <= took and 1 + took < TILED
    # where even a step of TILED tokens would take too long, the chunk is what a shorter step allows
    deeper = Seq(1, 2, 6000)
    deeper.n_past, deeper.tokens = 20000, [1] * 26000
    took = shares(plan_step([stream, deeper], n_batch=512, prefill_chunk=128, free_cells=60000, cost=tiled))[1][0]
    assert took == LEAST_READ   # (a short step holds 7 tokens in the time, a tiled one 20, short of TILED)


def test_a_copy_keeps_to_its_source_where_the_last_place_of_its_tokens_is_the_copy_itself():
    """A file rewritten as it is: its lines share more than twelve tokens and differ at the end. The
    longest run's last place is soon the line just copied, whose next line is another; the draft
    keeps to the place the copy came from, so no draft after the first misses."""
    common = list(range(1, 14))
    source = [90, 91, 92] + [t for k in range(6) for t in (*common, 100 + k)]
    tokens = [*source, 90, 91, 92]                    # the prompt, and the copy begun
    lookup, results = PromptLookup(most=16), []
    while len(tokens) < 2 * len(source):
        draft = lookup.draft(tokens, 64)
        written = len(tokens) - len(source)
        truth = source[written:written + len(draft) + 1]
        pairs = enumerate(zip(draft, truth, strict=False))   # (where the copy ends, truth is shorter)
        accepted = next((i for i, (d, t) in pairs if d != t), min(len(draft), len(truth)))
        if draft:
            lookup.checked(len(draft), accepted)
            results.append((min(len(draft), len(truth)), accepted))   # (the last may run past the end)
        tokens += truth[:accepted + 1]
    assert tokens[len(source):] == source
    assert len(results) > 4 and all(a == d for d, a in results)


def test_a_draft_whose_first_token_missed_keeps_its_length():
    """A first token that misses says prompt lookup found the wrong place, not that the right
    place's run is short: the next draft is as long as this one was."""
    lookup = PromptLookup(most=16)
    tokens = list(range(40)) + list(range(3))
    lookup.checked(4, 4)
    lookup.checked(8, 0)
    while not (draft := lookup.draft(tokens, 64)):   # (the pause after a miss)
        pass
    assert len(draft) == 8


def test_the_chance_of_a_drafted_token_separates_first_misses_from_the_runs_after():
    """Drafts that miss at once now and then, and run on once their place is right (a file being
    rewritten), keep their later tokens' chance high, where one rate for all to the i-th power
    made the sixteenth token's chance nothing."""
    lookup = PromptLookup(most=16)
    assert lookup.chances(2)[0] == 0.75 and lookup.chances(2)[1] == 0.75 ** 2   # before any draft
    for _ in range(4):
        for _ in range(4):
            lookup.checked(16, 16)
        lookup.checked(16, 0)
    one_rate = (lookup.accepted + 3) / (lookup.drafted + 4)   # (one rate for all, as the chance was before)
    assert 0.7 < lookup.chances(1)[0] < 0.8 and lookup.chances(16)[15] > 0.7
    assert one_rate ** 16 < 0.05
    # a run that stops partway counts against the tokens after the first
    other = PromptLookup(most=16)
    for _ in range(8):
        other.checked(16, 2)
    assert other.chances(1)[0] > 0.9 and other.chances(6)[5] < 0.1


def test_drafts_that_miss_only_at_their_first_token_are_checked_long_on_a_cpu():
    cpu = timed_cost(0.002, 0.006, 1e-7)
    seq = Seq(0, 1, 1, draft=list(range(16)))
    seq.n_past, seq.tokens = 2700, [1] * 2701
    lookup = PromptLookup(most=16)
    for _ in range(4):
        for _ in range(6):
            lookup.checked(16, 16)
        lookup.checked(16, 0)
    seq.chances = lookup.chances
    assert len(plan_step([seq], n_batch=512, prefill_chunk=128, free_cells=8000, cost=cpu)[0].draft) >= 8


def test_a_draft_that_does_not_pay_is_still_checked_a_token_deep_now_and_then():
    """Cut to nothing for good, a sequence would never learn that its drafts are accepted (nor the
    step's fit what a second token costs): one draft in PROBE_EVERY is checked a token deep."""
    cpu = timed_cost(0.002, 0.006, 1e-7)
    seq = Seq(0, 1, 1, draft=list(range(8)), acceptance=0.5)
    seq.pace = PromptLookup(most=8)
    kept = [len(plan_step([seq], n_batch=512, prefill_chunk=128, free_cells=8000, cost=cpu)[0].draft)
            for _ in range(3 * PROBE_EVERY)]
    assert kept == ([0] * (PROBE_EVERY - 1) + [1]) * 3
    # a draft that pays is not counted against the probe
    seq.rate = 0.99
    assert len(plan_step([seq], n_batch=512, prefill_chunk=128, free_cells=8000, cost=cpu)[0].draft) == 8


def test_a_sequence_starts_hopeful_so_its_first_drafts_are_checked():
    """Before any draft is checked the rate is three in four: on a CPU where a drafted token costs
    about half a one-token step, its first tokens pay; one in two would not."""
    cost = timed_cost(0.02, 0.0, 8e-6)   # (as fitted on two cores: a step's fixed part, and its cells)
    seq = Seq(0, 1, 1, draft=list(range(8)))
    seq.n_past, seq.tokens = 2700, [1] * 2701
    seq.rate = PromptLookup(most=8).chances(1)[0]
    assert seq.rate == 0.75
    assert len(plan_step([seq], n_batch=512, prefill_chunk=128, free_cells=8000, cost=cost)[0].draft) >= 1
    seq.rate = 0.5
    assert plan_step([seq], n_batch=512, prefill_chunk=128, free_cells=8000, cost=cost)[0].draft == []


def test_background_work_sits_out_the_steps_that_read_a_live_prompt():
    """A batch's lines are background work: while a live client's prompt is read they decode
    nothing (its first token waits for none of them), and beside live generations they draft
    nothing; alone, or beside a background prompt, they run as any work."""
    lines = [Seq(i, i, 1, draft=[7, 7], background=True) for i in range(3)]
    live = Seq(5, 9, 40)
    parts = shares(plan_step([*lines, live], n_batch=512, prefill_chunk=128, free_cells=8000, whole_drafts=True))
    assert parts == {5: (40, 0)}
    talking = Seq(6, 10, 1, draft=[7, 7])
    parts = shares(plan_step([*lines, talking], n_batch=512, prefill_chunk=128, free_cells=8000, whole_drafts=True))
    assert parts == {0: (1, 0), 1: (1, 0), 2: (1, 0), 6: (3, 2)}
    own = Seq(7, 11, 40, background=True)
    parts = shares(plan_step([*lines, own], n_batch=512, prefill_chunk=128, free_cells=8000, whole_drafts=True))
    assert parts[0] == (3, 2) and parts[7][0] > 0
    # a live prompt with no room to be read yet does not stop the background work
    parts = shares(plan_step([*lines, live], n_batch=512, prefill_chunk=128, free_cells=0, whole_drafts=True))
    assert {0, 1, 2} <= set(parts)


def test_a_draft_is_as_long_as_its_kind_allows_unless_the_setting_says():
    """Prompt lookup's drafts cost nothing to make; a draft model's cost it a step each. The
    default follows the kind of draft, not the host: a prompt with images on a host with a draft
    model drafts by lookup."""
    assert PromptLookup(None).most == 63 and ModelDraft(None).most == 16
    assert PromptLookup(5).most == 5 and ModelDraft(5).most == 5


def test_a_small_batch_is_written_as_a_large_one_is():
    """Small batches are written item by item, large ones through numpy's views: llama.cpp gets
    the same tokens, positions, sequence ids and logits flags either way."""
    import random

    import llama_cpp

    from openai_ext.hosts.llamacpp.plan import SMALL_BATCH, _write_arrays, _write_items, write

    def read(batch, n):
        return [(batch.token[i], batch.pos[i], batch.logits[i], batch.n_seq_id[i], batch.seq_id[i][0])
                for i in range(n)]

    rng = random.Random(7)
    one, other = llama_cpp.llama_batch_init(512, 0, 1), llama_cpp.llama_batch_init(512, 0, 1)
    try:
        for _ in range(300):
            rows = []
            for seq in rng.sample(range(8), rng.randint(1, 8)):
                count = rng.randint(1, 60)
                rows.append((seq, [rng.randrange(49152) for _ in range(count)], rng.randrange(5000),
                             rng.choice([0, count - 1, rng.randrange(count), count])))
            n = sum(len(r[1]) for r in rows)
            _write_items(one, rows, n)
            _write_arrays(other, rows, n)
            assert read(one, n) == read(other, n)
            assert write(one, rows) == n == one.n_tokens
        # what ``write`` chooses: the small way up to SMALL_BATCH tokens
        assert write(one, [(3, list(range(SMALL_BATCH)), 9, SMALL_BATCH - 1)]) == SMALL_BATCH
        assert read(one, SMALL_BATCH)[-1] == (SMALL_BATCH - 1, 9 + SMALL_BATCH - 1, 1, 1, 3)
        assert read(one, SMALL_BATCH)[0][2] == 0
    finally:
        llama_cpp.llama_batch_free(one)
        llama_cpp.llama_batch_free(other)
