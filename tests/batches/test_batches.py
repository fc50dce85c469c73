"""The Batch API (/v1/batches) driven with openai-python (strict validation) on the scripted host:
a file of requests runs through the server's own routes, its status and live counts move as
OpenAI's do, every answer lands in the output or error file once per custom_id, a cancel stops the
work, a restart goes on from the lines not done, and each key sees only its own batches."""

from __future__ import annotations

import io
import json

import openai
import pytest
from support.scripted import held
from support.servers import openai_client, wait_until
from support.spec import assert_valid

DONE = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def server(script, make_server, tmp_path):
    return make_server(script, data_dir=str(tmp_path / "data"))


def chat_line(i: int, **extra) -> dict:
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "x", "messages": [{"role": "user", "content": f"Question {i}"}], **extra}}


def upload(client, lines: list, purpose: str = "batch") -> str:
    data = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()
    return client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose=purpose).id


def finished(client, batch_id: str):
    box = {}

    def done():
        box["b"] = client.batches.retrieve(batch_id)
        return box["b"].status in DONE
    wait_until(done, f"batch {batch_id} ends", tries=1200)
    return box["b"]


def jsonl(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_of_chat_requests_runs_to_completion_with_one_answer_per_line(server, script):
    script.script(*[f"Answer {i}" for i in range(4)])
    client = openai_client(server)
    batch = client.batches.create(input_file_id=upload(client, [chat_line(i) for i in range(4)]),
                                  endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "a"})
    assert batch.status == "validating" and batch.metadata == {"job": "a"}
    assert batch.expires_at == batch.created_at + 24 * 3600
    done = finished(client, batch.id)
    assert done.status == "completed" and done.error_file_id is None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 4, 0)
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.usage.total_tokens > 0
    raw = openai_client(server).batches.with_raw_response.retrieve(batch.id).http_response.json()
    assert_valid("Batch", raw)
    out = jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == [f"req-{i}" for i in range(4)]
    for line in out:
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert_valid("CreateChatCompletionResponse", line["response"]["body"])
    answers = {o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"] for o in out}
    assert sorted(answers.values()) == [f"Answer {i}" for i in range(4)]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert [b.id for b in client.batches.list()] == [batch.id]
    # the lines' generations are background work for the host; a live request's is not
    assert len(script.calls) == 4 and all(c.settings.background for c in script.calls)
    client.chat.completions.create(model="x", messages=[{"role": "user", "content": "live"}])
    assert not script.calls[-1].settings.background


def test_a_request_the_api_refuses_goes_to_the_error_file_and_the_rest_run(server, script):
    script.script("fine", "also fine")
    client = openai_client(server)
    lines = [chat_line(0), chat_line(1, temperature=7), chat_line(2, stream=True), chat_line(3)]
    done = finished(client, client.batches.create(input_file_id=upload(client, lines),
                                                  endpoint="/v1/chat/completions", completion_window="24h").id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
    errors = {e["custom_id"]: e for e in jsonl(client, done.error_file_id)}
    assert errors["req-1"]["response"]["status_code"] == 400
    assert errors["req-1"]["response"]["body"]["error"]["param"] == "temperature"
    assert errors["req-2"]["response"] is None and "stream" in errors["req-2"]["error"]["message"]
    assert sorted(o["custom_id"] for o in jsonl(client, done.output_file_id)) == ["req-0", "req-3"]


def test_a_file_that_cannot_run_fails_the_batch_naming_its_lines(server):
    client = openai_client(server)
    lines = [chat_line(0), "{not json", {**chat_line(2), "url": "/v1/embeddings"}, chat_line(0)]
    done = finished(client, client.batches.create(input_file_id=upload(client, lines),
                                                  endpoint="/v1/chat/completions", completion_window="24h").id)
    assert done.status == "failed" and done.failed_at
    found = {(e.line, e.code) for e in done.errors.data}
    assert found == {(2, "invalid_json_line"), (3, "mismatched_url"), (4, "duplicate_custom_id")}


def test_a_batch_that_cannot_start_is_a_400_or_404_naming_why(server):
    client = openai_client(server)
    plain = upload(client, [chat_line(0)], purpose="user_data")
    good = upload(client, [chat_line(0)])
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        client.batches.create(input_file_id=plain, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=good, endpoint="/v1/images/generations", completion_window="24h")
    with pytest.raises(openai.NotFoundError, match="file-missing"):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=good, endpoint="/v1/chat/completions", completion_window="1h")
    with pytest.raises(openai.BadRequestError, match="colour"):
        client.batches.create(input_file_id=good, endpoint="/v1/chat/completions", completion_window="24h",
                              extra_body={"colour": "red"})
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nothing")
    assert list(client.batches.list()) == []


def test_a_cancel_stops_the_running_request_and_reports_the_rest_as_cancelled(server, script):
    running = held(at=2)
    script.script("first", running)
    client = openai_client(server)
    batch = client.batches.create(input_file_id=upload(client, [chat_line(i) for i in range(4)]),
                                  endpoint="/v1/chat/completions", completion_window="24h",
                                  output_expires_after={"anchor": "created_at", "seconds": 7200})
    wait_until(running.started.is_set, "the second request runs", tries=600)
    assert client.batches.retrieve(batch.id).request_counts.completed == 1   # live counts
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = finished(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    assert running.ended.is_set()   # the generation in flight was stopped
    out, errors = jsonl(client, done.output_file_id), jsonl(client, done.error_file_id)
    assert [o["custom_id"] for o in out] == ["req-0"]
    assert sorted(e["custom_id"] for e in errors) == ["req-1", "req-2", "req-3"]
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    for file_id in (done.output_file_id, done.error_file_id):   # output_expires_after, kept across the cancel
        made = client.files.retrieve(file_id)
        assert made.expires_at == made.created_at + 7200
    assert client.batches.cancel(batch.id).status == "cancelled"   # again: nothing changes
    script.script("last")
    complete = finished(client, client.batches.create(input_file_id=upload(client, [chat_line(9)]),
                                                      endpoint="/v1/chat/completions", completion_window="24h").id)
    with pytest.raises(openai.BadRequestError, match="is completed; only a batch that is validating or in progress"):
        client.batches.cancel(complete.id)


def test_a_restart_goes_on_from_the_lines_not_done(script, make_server, tmp_path):
    stuck = held(at=1)
    script.script("one", "two", stuck)
    first = make_server(script, data_dir=str(tmp_path / "data"))
    client = openai_client(first)
    batch = client.batches.create(input_file_id=upload(client, [chat_line(i) for i in range(4)]),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    wait_until(stuck.started.is_set, "the third request runs", tries=600)
    first.stop()
    script.script("three", "four")
    again = openai_client(make_server(script, data_dir=str(tmp_path / "data")))
    done = finished(again, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 4
    answers = sorted(o["response"]["body"]["choices"][0]["message"]["content"] for o in jsonl(again, done.output_file_id))
    assert answers == ["four", "one", "three", "two"]


def test_a_responses_batch_stores_each_response_as_the_batch_owner(script, make_server, tmp_path):
    server = make_server(script, data_dir=str(tmp_path / "data"), api_key="key-a", admin_key="key-b")
    a, b = openai_client(server, api_key="key-a"), openai_client(server, api_key="key-b")
    script.script("Stored answer")
    line = {"custom_id": "r1", "method": "POST", "url": "/v1/responses", "body": {"model": "x", "input": "Hi"}}
    done = finished(a, a.batches.create(input_file_id=upload(a, [line]), endpoint="/v1/responses",
                                        completion_window="24h").id)
    body = jsonl(a, done.output_file_id)[0]["response"]["body"]
    assert_valid("Response", body)
    assert a.responses.retrieve(body["id"]).output_text == "Stored answer"
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(body["id"])
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(done.id)
    assert list(b.batches.list()) == []


def test_a_line_whose_answer_fails_inside_the_server_is_its_own_failure(server, script, monkeypatch):
    """A fault while one line is answered goes to the error file as a 500; the other lines run."""
    from openai_ext.batches import run

    real = run.call

    async def flaky(app, path, body, owner, gone):
        if body["messages"][0]["content"] == "Question 1":
            raise RuntimeError("broken")
        return await real(app, path, body, owner, gone)
    monkeypatch.setattr(run, "call", flaky)
    script.script("a", "b")
    client = openai_client(server)
    done = finished(client, client.batches.create(input_file_id=upload(client, [chat_line(i) for i in range(3)]),
                                                  endpoint="/v1/chat/completions", completion_window="24h").id)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    error = jsonl(client, done.error_file_id)[0]
    assert error["custom_id"] == "req-1" and error["response"]["status_code"] == 500


def test_a_store_that_fails_while_a_batch_runs_pauses_it_and_it_goes_on(server, script, monkeypatch):
    """A write of a line's result that the store refuses (it went away) does not fail the batch:
    the batch waits, is taken up again, and runs the line again."""
    from openai_ext.batches.rows import BatchRows
    from openai_ext.responses.store_health import StoreUnavailable

    real, refused = BatchRows.add_line, []

    def once(self, batch_id, line, ok, body):
        if line == 2 and not refused:
            refused.append(line)
            raise StoreUnavailable("The store went away.")
        return real(self, batch_id, line, ok, body)
    monkeypatch.setattr(BatchRows, "add_line", once)
    script.script("a", "b", "b again", "c")
    client = openai_client(server)
    done = finished(client, client.batches.create(input_file_id=upload(client, [chat_line(i) for i in range(3)]),
                                                  endpoint="/v1/chat/completions", completion_window="24h").id)
    assert refused == [2] and done.status == "completed" and done.request_counts.completed == 3
    answers = sorted(o["response"]["body"]["choices"][0]["message"]["content"] for o in jsonl(client, done.output_file_id))
    assert answers == ["a", "b again", "c"]
