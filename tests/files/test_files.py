"""The Files API (/v1/files) driven with openai-python (strict validation), every body checked
against OpenAI's spec: uploads kept byte for byte and across a restart, listing with its cursor
and filters, expiry, each key's files its own, bad input answered with the API's error, and the
size limit applied as the body arrives."""

from __future__ import annotations

import io
import sqlite3
import time

import httpx
import openai
import pytest
from support.servers import openai_client
from support.spec import assert_valid

from openai_ext.responses.store_sqlite import FILE

EVERY_BYTE = bytes(range(256)) * 64


@pytest.fixture
def server(scripted_host, make_server, tmp_path):
    return make_server(scripted_host, data_dir=str(tmp_path / "data"))


def raw(server, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", timeout=30, **kw)


def test_a_file_is_kept_listed_read_back_byte_for_byte_and_deleted(server):
    client = openai_client(server)
    made = client.files.create(file=("data.bin", io.BytesIO(EVERY_BYTE)), purpose="user_data")
    assert made.object == "file" and made.bytes == len(EVERY_BYTE) and made.filename == "data.bin"
    assert made.purpose == "user_data" and made.id.startswith("file-") and made.expires_at is None
    assert client.files.retrieve(made.id) == made
    assert client.files.content(made.id).content == EVERY_BYTE
    assert [f.id for f in client.files.list()] == [made.id]
    for path in (f"/files/{made.id}", "/files"):
        body = raw(server, "GET", path).json()
        assert_valid("OpenAIFile" if path != "/files" else "ListFilesResponse", body)
    content = raw(server, "GET", f"/files/{made.id}/content")
    assert content.headers["content-length"] == str(len(EVERY_BYTE))
    deleted = raw(server, "DELETE", f"/files/{made.id}").json()
    assert_valid("DeleteFileResponse", deleted)
    assert deleted == {"id": made.id, "object": "file", "deleted": True}
    for call in (lambda: client.files.retrieve(made.id), lambda: client.files.content(made.id),
                 lambda: client.files.delete(made.id)):
        with pytest.raises(openai.NotFoundError, match=made.id):
            call()
    assert list(client.files.list()) == []


def test_a_large_upload_is_kept_whole(server):
    blob = bytes(range(251)) * (3 * 2 ** 20 // 251)   # ~3 MB, spooled to disk by the parser
    client = openai_client(server)
    made = client.files.create(file=("big.jsonl", blob), purpose="assistants")
    assert made.bytes == len(blob) and client.files.content(made.id).content == blob


def test_files_are_listed_by_a_cursor_in_either_order_and_by_purpose(server):
    client = openai_client(server)
    ids = [client.files.create(file=(f"f{i}.txt", f"text {i}".encode()),
                               purpose="batch" if i % 2 else "user_data").id for i in range(5)]
    first = client.files.list(limit=2, order="asc")
    assert [f.id for f in first.data] == ids[:2] and first.has_more
    # the SDK follows the cursor (after=last_id) through every page
    assert [f.id for f in client.files.list(limit=2, order="asc")] == ids
    assert [f.id for f in client.files.list(limit=2)] == ids[::-1]
    page = raw(server, "GET", "/files", params={"limit": 2, "order": "asc", "after": ids[3]}).json()
    assert_valid("ListFilesResponse", page)
    assert [f["id"] for f in page["data"]] == ids[4:] and page["has_more"] is False
    assert page["first_id"] == page["last_id"] == ids[4]
    assert [f.id for f in client.files.list(purpose="batch", order="asc")] == ids[1::2]
    with pytest.raises(openai.NotFoundError, match="file-nothing"):
        client.files.list(after="file-nothing")
    for bad in ({"limit": 0}, {"limit": 10001}, {"order": "up"}):
        assert raw(server, "GET", "/files", params=bad).status_code == 400


def test_a_file_expires_when_asked_and_a_batch_file_after_30_days(server, tmp_path):
    client = openai_client(server)
    soon = client.files.create(file=("a.txt", b"a"), purpose="user_data",
                               expires_after={"anchor": "created_at", "seconds": 3600})
    assert soon.expires_at == soon.created_at + 3600
    batch = client.files.create(file=("b.jsonl", b"{}\n"), purpose="batch")
    assert batch.expires_at == batch.created_at + 30 * 86400
    # time passes: the file's expiry is moved into the past
    with sqlite3.connect(tmp_path / "data" / FILE) as conn:
        conn.execute("UPDATE files SET expires_at = ? WHERE id = ?", (time.time() - 1, soon.id))
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(soon.id)
    assert [f.id for f in client.files.list()] == [batch.id]
    # its content is removed as the next upload comes in
    assert (tmp_path / "data" / "files" / soon.id).exists()
    client.files.create(file=("c.txt", b"c"), purpose="user_data")
    assert not (tmp_path / "data" / "files" / soon.id).exists()


def test_a_file_outlives_the_server(scripted_host, make_server, tmp_path):
    first = make_server(scripted_host, data_dir=str(tmp_path / "data"))
    made = openai_client(first).files.create(file=("keep.txt", b"kept"), purpose="user_data")
    first.stop()
    again = openai_client(make_server(scripted_host, data_dir=str(tmp_path / "data")))
    assert again.files.retrieve(made.id) == made and again.files.content(made.id).content == b"kept"


def test_each_key_sees_only_its_own_files(scripted_host, make_server, tmp_path):
    server = make_server(scripted_host, data_dir=str(tmp_path / "data"), api_key="key-a", admin_key="key-b")
    a, b = openai_client(server, api_key="key-a"), openai_client(server, api_key="key-b")
    mine = a.files.create(file=("a.txt", b"secret"), purpose="user_data")
    theirs = b.files.create(file=("b.txt", b"other"), purpose="user_data")
    assert [f.id for f in a.files.list()] == [mine.id] and [f.id for f in b.files.list()] == [theirs.id]
    for call in (lambda: b.files.retrieve(mine.id), lambda: b.files.content(mine.id),
                 lambda: b.files.delete(mine.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.NotFoundError):
        b.files.list(after=mine.id)
    assert a.files.content(mine.id).content == b"secret"
    assert raw(server, "GET", "/files").status_code == 401   # no key, no files


@pytest.mark.parametrize("fields, files, param", [
    ({}, {"file": ("a.txt", b"x")}, "purpose"),
    ({"purpose": "training"}, {"file": ("a.txt", b"x")}, "purpose"),
    ({"purpose": "evals"}, {"file": ("a.txt", b"x")}, "purpose"),
    ({"purpose": "user_data"}, {}, "file"),
    ({"purpose": "user_data", "file": "not a file"}, {"other": ("a.txt", b"x")}, "file"),
    ({"purpose": "user_data", "colour": "red"}, {"file": ("a.txt", b"x")}, "colour"),
    ({"purpose": "user_data", "expires_after[anchor]": "created_at", "expires_after[seconds]": "60"},
     {"file": ("a.txt", b"x")}, "expires_after.seconds"),
    ({"purpose": "user_data", "expires_after[anchor]": "now", "expires_after[seconds]": "3600"},
     {"file": ("a.txt", b"x")}, "expires_after.anchor"),
])
def test_a_bad_upload_gets_a_400_that_names_the_field(server, fields, files, param):
    reply = raw(server, "POST", "/files", data=fields, files=files or {"unrelated": ("x", b"")})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert list(openai_client(server).files.list()) == []


def test_an_upload_that_is_not_a_form_is_refused(server):
    reply = raw(server, "POST", "/files", json={"purpose": "user_data", "file": "abc"})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_content_type"


def test_an_upload_over_the_limit_is_refused_as_it_arrives(scripted_host, make_server, tmp_path):
    server = make_server(scripted_host, data_dir=str(tmp_path / "data"), files_max_mb=0.25)
    client = openai_client(server)
    big = b"x" * (2 ** 20)
    with pytest.raises(openai.APIStatusError) as declared:
        client.files.create(file=("big.bin", big), purpose="user_data")
    assert declared.value.status_code == 413 and "files_max_mb" in declared.value.message
    # a body of no declared length (chunked) is stopped as it grows past the limit

    def chunks():
        yield b"--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n"
        yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n\r\n"
        for _ in range(8):
            yield b"x" * 2 ** 17
        yield b"\r\n--b--\r\n"
    reply = raw(server, "POST", "/files", content=chunks(), headers={"content-type": "multipart/form-data; boundary=b"})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
    assert list(client.files.list()) == [] and not any((tmp_path / "data" / "files").glob("*"))
    small = client.files.create(file=("ok.bin", b"y" * 1000), purpose="user_data")
    assert client.files.content(small.id).content == b"y" * 1000


def test_without_a_store_files_are_refused_with_the_reason(scripted_host, make_server, tmp_path):
    server = make_server(scripted_host, data_dir=str(tmp_path / "data"), responses_store=False)
    with pytest.raises(openai.BadRequestError, match="responses_store"):
        openai_client(server).files.create(file=("a.txt", b"a"), purpose="user_data")


def test_a_deleted_file_leaves_the_vector_stores_it_was_in(server):
    """As at OpenAI: deleting a file removes it from every vector store (its chunks with it)."""
    client = openai_client(server)
    made = client.files.create(file=("notes.md", b"# Notes"), purpose="assistants")
    kept = client.files.create(file=("other.md", b"# Other"), purpose="assistants")
    stores = [client.vector_stores.create(name=f"s{i}", file_ids=[made.id, kept.id]) for i in range(2)]
    client.files.delete(made.id)
    for store in stores:
        assert [f.id for f in client.vector_stores.files.list(vector_store_id=store.id)] == [kept.id]
        with pytest.raises(openai.NotFoundError):
            client.vector_stores.files.retrieve(vector_store_id=store.id, file_id=made.id)
