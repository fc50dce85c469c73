"""The embedded host's sequences share one KV cache: a request may use the whole context, one that
does not fit beside the running ones waits, and when the running ones outgrow the cache the
youngest gives its cells back and goes on later, its answer whole.

Order is asserted through events and the server's own counts, never through timers."""

from __future__ import annotations

import threading

import httpx
import pytest
from support.servers import openai_client
from support.spec import assert_valid
from test_batching import GREEDY, LONG, Log, assert_same_greedy_answer, generate, in_thread, prompt, stream, until

from openai_ext.core.config import Settings
from openai_ext.hosts.request import GenerationSettings

pytestmark = pytest.mark.slow


def assert_cells_follow_llama_cpp(host) -> None:
    """The scheduler's count of each sequence's cells is what llama.cpp holds for it."""
    sched, L = host._sched, host.runtime.L
    mem = L.llama_get_memory(host.runtime.ctx)
    with sched._cond:
        for slot in sched.slots:
            n = sched.cells.length(slot.id)
            assert n == len(slot.held()), slot.id
            assert L.llama_memory_seq_pos_max(mem, slot.id) == n - 1, slot.id
            assert L.llama_memory_seq_pos_min(mem, slot.id) == (0 if n else -1), slot.id


@pytest.fixture(scope="module")
def default_host():
    """The host as a user gets it: the model's own context (8192 tokens), the default parallel."""
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    host = LlamaCppHost(default_gguf(), parallel=Settings().parallel)
    yield host
    host.close()


@pytest.fixture(scope="module")
def small_host():
    """A cache of 1,024 cells for two sequences: easy to fill. One token a step: with speculation
    a sequence whose text repeats itself runs ahead and may end before the two outgrow the cache
    (speculation's own tests are in test_speculation.py)."""
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    host = LlamaCppHost(default_gguf(), n_ctx=1024, parallel=2, speculation="off")
    yield host
    host.close()


def logged_run(host, log: Log, default: GenerationSettings | None = None):
    """A generation on ``host`` that notes each token and its end in ``log`` as ``who``; its pieces."""
    def run(who, text, settings=default):
        pieces = []
        for piece in host.generate(prompt(host, text), settings, threading.Event()):
            log.add(who, "token")
            pieces.append(piece)
        log.add(who, "done")
        return pieces
    return run


def long_text(host, tokens: int) -> str:
    """A user message whose chat prompt is ``tokens`` tokens, give or take a few."""
    words = ["river", "stone", "lantern", "harbour", "meadow", "copper", "violin", "orchard"]
    n = tokens
    for _ in range(5):   # each word is about one token: a few corrections get it right
        text = " ".join(words[i % len(words)] for i in range(n))
        n += tokens - len(prompt(host, text).tokens)
    return text


def test_a_prompt_of_three_quarters_of_the_context_is_served_at_default_settings_beside_a_stream(
        default_host, make_server):
    server = make_server(default_host)
    n_ctx = default_host.context_length()
    assert n_ctx == 8192 and default_host.parallel == 16    # the model's whole context, for each request
    assert default_host.flash_attn                           # several sequences: the cells of others skipped
    log = Log()
    other = in_thread(stream, server, "other", log, {"max_tokens": 400, "temperature": 0, "ban_eos_token": True,
                                                     "messages": [{"role": "user", "content": LONG}]})
    until(lambda: ("other", "token") in log.first, "the other stream started")
    text = long_text(default_host, n_ctx * 3 // 4)
    seen = []

    def watch():   # /health while the long request runs: the cells it holds are shown
        while not done.is_set():
            running = ("other", "done") not in log.first
            seen.append({**httpx.get(server.url.removesuffix("/v1") + "/health", timeout=10).json(),
                         "other running": running})
    done = threading.Event()
    watcher = in_thread(watch)
    client = openai_client(server, timeout=600)
    raw = client.chat.completions.with_raw_response.create(
        model="x", max_tokens=16, temperature=0, messages=[{"role": "user", "content": text}],
        extra_body={"ban_eos_token": True})
    log.add("long", "done")
    done.set()
    watcher.result()
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    reply = raw.parse()
    assert abs(reply.usage.prompt_tokens - n_ctx * 3 // 4) <= 4 and reply.usage.completion_tokens == 16
    chunks = other.result()
    # served while the stream ran: past half the context's cells read with the stream still going
    # (which ends first depends on how the steps share time between them, not asserted)
    assert any(h["other running"] and h["kv_cells"]["used"] >= n_ctx // 2 for h in seen)
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 0
    cells = [h["kv_cells"] for h in seen]
    assert all(c["total"] == n_ctx for c in cells)
    assert max(c["used"] for c in cells) >= n_ctx * 3 // 4           # both sequences' cells, in one cache
    until(default_host.idle, "the host idle")
    assert_cells_follow_llama_cpp(default_host)


def test_a_prompt_longer_than_the_whole_context_is_refused_not_cut(default_host, make_server):
    import openai

    server = make_server(default_host)
    with pytest.raises(openai.BadRequestError) as e:
        openai_client(server).chat.completions.create(
            model="x", messages=[{"role": "user", "content": "word " * 8300}])
    assert e.value.code == "context_length_exceeded" and "8192" in e.value.message


def test_a_request_that_does_not_fit_beside_the_running_one_waits_for_room(small_host):
    log = Log()
    running = GREEDY.replace(max_new_tokens=300, samplers={"ban_eos_token": True})

    run = logged_run(small_host, log)

    first = in_thread(run, "first", LONG, running)
    big = long_text(small_host, 850)
    # once the first holds ~240 cells, 850 more do not fit in 1,024
    until(lambda: log.events.count(("first", "token")) >= 200, "the first one 200 tokens on")
    second = in_thread(run, "second", big, GREEDY.replace(max_new_tokens=8))
    first_pieces, second_pieces = first.result(), second.result()
    assert sum(p.tokens for p in first_pieces) == 300 and first_pieces[-1].finish_reason == "length"
    assert second_pieces[-1].finish_reason in ("stop", "length") and second_pieces
    # it waited: its first token came after the running one had finished
    assert log.index("second", "token") > log.index("first", "done")
    assert small_host.batch_stats()["preempted"] == 0
    assert_cells_follow_llama_cpp(small_host)


def test_when_the_running_sequences_outgrow_the_cache_the_youngest_pauses_and_finishes_whole(small_host):
    log = Log()
    settings = GREEDY.replace(max_new_tokens=600, samplers={"ban_eos_token": True}, logprobs=2)
    before = small_host.batch_stats()

    run = logged_run(small_host, log, settings)

    older = in_thread(run, "older", f"{LONG} The first one.")
    until(lambda: ("older", "token") in log.first, "the older one generating")
    younger = in_thread(run, "younger", f"{LONG} The second one.")
    until(lambda: ("younger", "token") in log.first, "the younger one generating")
    older_pieces, younger_pieces = older.result(), younger.result()
    after = small_host.batch_stats()
    assert after["preempted"] > before["preempted"]     # 2 x (~40 + 600) cells do not fit in 1,024
    for pieces in (older_pieces, younger_pieces):      # each answer whole: every token once, to the budget
        assert sum(p.tokens for p in pieces) == 600 and pieces[-1].finish_reason == "length"
        assert len(pieces) == 600 and all(p.logprob is not None for p in pieces)
    # the younger one gave way: it had begun before the older finished, and ended after it
    assert log.index("younger", "token") < log.index("older", "done") < log.index("younger", "done")
    assert log.last("older", "token") > log.index("younger", "token")
    # and its text is what it would have been alone: reading it again changed nothing but timing
    assert_same_greedy_answer(generate(small_host, f"{LONG} The second one.", settings), younger_pieces)
    assert_cells_follow_llama_cpp(small_host)


def test_a_short_request_starts_while_a_long_one_waits_for_room_and_health_shows_the_wait(small_host):
    log = Log()
    running = GREEDY.replace(max_new_tokens=300, samplers={"ban_eos_token": True})

    run = logged_run(small_host, log)

    before = small_host.batch_stats()["passed"]
    first = in_thread(run, "first", LONG, running)
    until(lambda: log.events.count(("first", "token")) >= 200, "the first one 200 tokens on")
    big = in_thread(run, "big", long_text(small_host, 850), GREEDY.replace(max_new_tokens=8))
    until(lambda: small_host.sequences()["waiting"] == 1, "the long prompt waiting for room")
    assert small_host.sequences() == {"running": 1, "waiting": 1, "slots": 2}
    short = in_thread(run, "short", "Say hello.", GREEDY.replace(max_new_tokens=4))
    short.result()
    first.result(), big.result()
    # the short one went past the one waiting, while the first still ran; the long one still
    # started as soon as the first had finished
    assert log.index("short", "done") < log.index("first", "done") < log.index("big", "token")
    assert small_host.batch_stats()["passed"] == before + 1
    assert_cells_follow_llama_cpp(small_host)
