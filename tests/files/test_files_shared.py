"""Files on a real PostgreSQL store shared by two servers (one folder of contents between them):
a file uploaded through one is read and deleted through the other; a database that goes away is a
prompt 503 naming the store, and files are served again when it is back, with no restart."""

from __future__ import annotations

import time

import openai
import pytest
from support.servers import openai_client, start_server

psycopg = pytest.importorskip("psycopg")


def test_a_file_uploaded_through_one_server_is_read_and_deleted_through_the_other(scripted_host, postgres, tmp_path):
    url = postgres.url(postgres.new_database())
    servers = [start_server(scripted_host, database_url=url, files_dir=str(tmp_path / "shared")) for _ in range(2)]
    try:
        one, other = (openai_client(s) for s in servers)
        made = one.files.create(file=("notes.md", b"# Notes\n\nshared"), purpose="assistants")
        assert other.files.retrieve(made.id) == made
        assert other.files.content(made.id).content == b"# Notes\n\nshared"
        assert [f.id for f in other.files.list()] == [made.id]
        other.files.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            one.files.retrieve(made.id)
        assert not (tmp_path / "shared" / made.id).exists()
    finally:
        for server in servers:
            server.stop()


def test_a_database_that_goes_away_fails_file_calls_fast_and_named_until_it_is_back(scripted_host, postgres,
                                                                                     tmp_path):
    name = postgres.new_database()
    server = start_server(scripted_host, database_url=postgres.url(name, password="hunter2"), files_dir=str(tmp_path))
    try:
        client = openai_client(server)
        made = client.files.create(file=("a.txt", b"kept"), purpose="user_data")
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            for call in (lambda: client.files.retrieve(made.id),
                         lambda: client.files.create(file=("b.txt", b"lost"), purpose="user_data")):
                with pytest.raises(openai.InternalServerError) as e:
                    call()
                error = e.value.response.json()["error"]
                assert e.value.status_code == 503 and "database_url" in error["message"]
                assert "hunter2" not in error["message"]
            # the upload that could not be recorded left no content behind
            assert [p.name for p in tmp_path.iterdir()] == [made.id]
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        for _ in range(600):   # found again by the store's own heartbeat
            try:
                assert client.files.content(made.id).content == b"kept"
                break
            except openai.InternalServerError:
                time.sleep(0.05)
        else:
            pytest.fail("the files did not come back with the database")
    finally:
        server.stop()
