"""``input_file`` parts in Responses: an uploaded file (file_id) or one sent inline (file_data) is
read as text (PDF and Markdown here) and shown to the model; a chain shows it again; every mistake
is a 400 or 404 naming the part."""

from __future__ import annotations

import base64

import httpx
import pytest
from support.pdf import one_page
from support.responses_api import create
from support.servers import openai_client
from support.spec import assert_valid

NOTES = b"# Notes\n\nThe meeting moved to Thursday at noon."


@pytest.fixture(scope="module")
def server(scripted_host, make_server, tmp_path_factory):
    return make_server(scripted_host, data_dir=str(tmp_path_factory.mktemp("input-files")))


def ask(content: list[dict]) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "What does it say?"}, *content]}]


def test_an_uploaded_file_is_read_by_the_model_and_kept_as_text(server, script):
    client = openai_client(server)
    notes = client.files.create(file=("notes.md", NOTES), purpose="user_data")
    script.script("Thursday at noon.", "Yes, Thursday.")
    first, _ = create(client, input=ask([{"type": "input_file", "file_id": notes.id}]))
    prompt = script.calls[-1].prompt.text
    assert "File notes.md:\n# Notes\n\nThe meeting moved to Thursday at noon." in prompt
    listed = client.responses.input_items.with_raw_response.list(first.id).http_response.json()
    assert_valid("ResponseItemList", listed)
    assert listed["data"][0]["content"][1] == {"type": "input_text", "text": "File notes.md:\n" + NOTES.decode()}
    client.files.delete(notes.id)   # the chain needs the file no longer
    create(client, input="Sure?", previous_response_id=first.id)
    assert "Thursday at noon" in script.calls[-1].prompt.text


def test_a_pdf_sent_inline_is_read(server, script):
    client = openai_client(server)
    data = base64.b64encode(one_page("Annual leave is 25 days.")).decode()
    script.script("25 days.", "25.")
    create(client, input=ask([{"type": "input_file", "filename": "policy.pdf",
                               "file_data": f"data:application/pdf;base64,{data}"}]))
    assert "File policy.pdf:\nAnnual leave is 25 days." in script.calls[-1].prompt.text
    create(client, input=ask([{"type": "input_file", "filename": "policy.pdf", "file_data": data}]))
    assert "Annual leave is 25 days." in script.calls[-1].prompt.text


@pytest.mark.parametrize("part, status, param, words", [
    ({"type": "input_file", "file_id": "file-nope"}, 404, "input[0].content[1].file_id", "file-nope"),
    ({"type": "input_file", "file_url": "https://example.com/a.pdf"}, 400, "input[0].content[1].file_url",
     "fetches nothing"),
    ({"type": "input_file", "file_data": "aGk="}, 400, "input[0].content[1].filename", "filename"),
    ({"type": "input_file", "filename": "a.txt", "file_data": "%%%"}, 400, "input[0].content[1].file_data",
     "base64"),
    ({"type": "input_file", "filename": "a.png", "file_data": base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()},
     400, "input[0].content[1]", "png"),
    ({"type": "input_file"}, 400, "input[0].content[1]", "file_id"),
])
def test_a_bad_part_is_an_error_naming_it(server, part, status, param, words):
    r = httpx.post(f"{server.url}/responses", json={"model": "x", "input": ask([part])}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_another_keys_file_is_not_read(scripted_host, make_server, tmp_path):
    server = make_server(scripted_host, data_dir=str(tmp_path), api_key="key-one", admin_key="key-two")
    mine = openai_client(server, api_key="key-one").files.create(file=("a.md", b"secret"), purpose="user_data")
    r = httpx.post(f"{server.url}/responses", headers={"Authorization": "Bearer key-two"}, timeout=60,
                   json={"model": "x", "input": ask([{"type": "input_file", "file_id": mine.id}])})
    assert r.status_code == 404 and r.json()["error"]["param"] == "input[0].content[1].file_id"


def test_chats_file_parts_are_read_too(server, script):
    """Chat's {"type": "file", "file": {...}} parts, by file_id or file_data, as the model's text."""
    client = openai_client(server)
    notes = client.files.create(file=("notes.md", NOTES), purpose="user_data")
    data = base64.b64encode(one_page("Annual leave is 25 days.")).decode()
    script.script("Thursday, and 25 days.")
    done = client.chat.completions.create(model="x", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What do these say?"},
        {"type": "file", "file": {"file_id": notes.id}},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{data}", "filename": "policy.pdf"}}]}])
    assert done.choices[0].message.content == "Thursday, and 25 days."
    prompt = script.calls[-1].prompt.text
    assert "File notes.md:\n# Notes" in prompt and "File policy.pdf:\nAnnual leave is 25 days." in prompt
    for part, param in (({"type": "file", "file": {"file_id": "file-nope"}}, "messages[0].content[0].file.file_id"),
                        ({"type": "file"}, "messages[0].content[0].file")):
        r = httpx.post(f"{server.url}/chat/completions", timeout=60,
                       json={"model": "x", "messages": [{"role": "user", "content": [part]}]})
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_a_request_is_bounded_before_its_files_are_read(server, script):
    """A file named many times is read once, and text longer than the context could hold is a 400
    at once (not a prompt built to be refused)."""
    client = openai_client(server)
    big = client.files.create(file=("big.txt", b"word " * 200_000), purpose="user_data")
    r = httpx.post(f"{server.url}/responses", timeout=60, json={"model": "x", "input": ask(
        [{"type": "input_file", "file_id": big.id}] * 200)})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"].startswith("input[0].content[")
