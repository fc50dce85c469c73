"""The PostgreSQL store's own concerns: its schema from an empty database, a newer schema refused,
servers starting at once migrating once, and a database that cannot be reached (at start, a clear
error; during a request, a 503 in the API's error shape), its password never shown."""

from __future__ import annotations

import threading

import pytest
from support.servers import run_together

from openai_ext.app import create_app
from openai_ext.core.config import Settings, SettingsError, load_settings
from openai_ext.core.migrations import SchemaTooNew
from openai_ext.responses import store_postgres
from openai_ext.responses.store import Store
from openai_ext.responses.store_postgres import StoreUnavailable, masked
from openai_ext.responses.store_schema import STEPS as MIGRATIONS

psycopg = pytest.importorskip("psycopg")


def version(url: str) -> int | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT version FROM {store_postgres.VERSION_TABLE}").fetchone()
        return row[0] if row else None


def test_an_empty_database_gets_the_latest_schema(pg_url):
    store = Store(database_url=pg_url)
    store.put_conversation({"id": "conv_1", "created_at": 1, "metadata": {}}, "", [])
    store.close()
    assert version(pg_url) == len(MIGRATIONS)
    with psycopg.connect(pg_url) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"responses", "items", "events", "conversations", "conversation_items", "instances"} <= tables
    again = Store(database_url=pg_url)   # opening again changes nothing
    assert again.conversation("conv_1", None)["id"] == "conv_1"
    again.close()
    assert version(pg_url) == len(MIGRATIONS)


def test_a_database_of_the_first_release_moves_to_the_version_sqlite_has(pg_url):
    """One list of named steps for both databases: PostgreSQL's first release stopped at version 1
    with the tables SQLite reaches at version 2; it is brought forward, its rows kept, nothing run for
    step 2, and the later steps (files) as on any database."""
    store = Store(database_url=pg_url)
    store.put_conversation({"id": "conv_old", "created_at": 1, "metadata": {}}, "", [])
    store.close()
    with psycopg.connect(pg_url) as conn:
        conn.execute(f"UPDATE {store_postgres.VERSION_TABLE} SET version = 1")
        for table in ("files", "batches", "batch_lines", "vector_stores", "vector_store_files",
                      "vector_store_file_batches", "vector_chunks"):   # (made by later steps: the first release had none)
            conn.execute(f"DROP TABLE {table}")
    assert [step.name for step in MIGRATIONS[:2]] == ["schema", "instances"] and MIGRATIONS[1].postgres is None
    again = Store(database_url=pg_url)
    assert again.conversation("conv_old", None)["id"] == "conv_old"
    assert again.run(lambda c: c.execute("SELECT count(*) FROM files").fetchone()[0]) == 0
    again.close()
    assert version(pg_url) == len(MIGRATIONS) == 5


def test_a_database_from_a_newer_server_is_refused_untouched(pg_url):
    store = Store(database_url=pg_url)
    store.put_response({"id": "resp_1", "created_at": 1, "status": "in_progress", "output": []}, "", [])
    store.close()
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE responses SET status = 'in_progress'")   # the sweep would mark it failed
        conn.execute(f"UPDATE {store_postgres.VERSION_TABLE} SET version = %s", (len(MIGRATIONS) + 1,))
    newer = Store(database_url=pg_url)
    with pytest.raises(SchemaTooNew, match=rf"newer version.*schema version {len(MIGRATIONS) + 1}.*knows up to "
                                           rf"{len(MIGRATIONS)}"):
        newer.response("resp_1", None)
    newer.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT status FROM responses").fetchall() == [("in_progress",)]
    assert version(pg_url) == len(MIGRATIONS) + 1


def test_servers_starting_at_once_migrate_once(pg_url):
    counted = []
    steps = [*MIGRATIONS, lambda conn: counted.append(conn.execute("SELECT COUNT(*) FROM responses").fetchone())]
    barrier = threading.Barrier(4)

    def opener(_: int) -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            barrier.wait()
            store_postgres.migrate(conn, steps, what="test")

    run_together(opener, 4)
    assert counted == [(0,)]   # one connection ran the new step, the others found it done
    assert version(pg_url) == len(steps)


def test_the_password_is_masked():
    assert masked("postgresql://app:s3cr%40t@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert masked("postgresql://db/x?password=s3cret&sslmode=require") == "postgresql://db/x?password=***&sslmode=require"
    assert masked("postgresql://db/x") == "postgresql://db/x"


def test_a_database_that_cannot_be_reached_is_a_503_that_names_it_without_its_password(postgres):
    from support.servers import free_port

    url = f"postgresql://app:hunter2@127.0.0.1:{free_port()}/x"
    store = Store(database_url=url)
    with pytest.raises(StoreUnavailable) as e:
        store.response("resp_1", None)
    assert e.value.status == 503 and "hunter2" not in e.value.message
    assert "postgresql://app:***@127.0.0.1" in e.value.message and "database_url" in e.value.message
    store.close()


def test_a_server_does_not_start_on_a_database_it_cannot_use(scripted_host, caplog):
    from support.servers import free_port

    url = f"postgresql://app:hunter2@127.0.0.1:{free_port()}/x"
    with pytest.raises(SettingsError) as e:
        create_app(Settings(port=0, database_url=url), scripted_host)
    assert "database_url" in str(e.value) and "***" in str(e.value) and "hunter2" not in str(e.value)
    assert "hunter2" not in caplog.text


def test_the_setting_takes_postgresql_urls_only(monkeypatch):
    monkeypatch.setenv("OPENEDAI_DATABASE_URL", "mysql://root:hunter2@db/x")
    with pytest.raises(SettingsError) as e:
        load_settings(file="/nonexistent/settings.json")
    assert "database_url must be a PostgreSQL URL" in str(e.value) and "hunter2" not in str(e.value)
    monkeypatch.setenv("OPENEDAI_DATABASE_URL", "postgresql://db/x")
    assert load_settings(file="/nonexistent/settings.json").database_url == "postgresql://db/x"
