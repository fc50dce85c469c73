"""A batch on a PostgreSQL store shared by two servers (and one folder of files): exactly one of
them runs it, whichever it was created through; both report its live counts."""

from __future__ import annotations

import pytest
from support.servers import openai_client, start_server
from test_batches import chat_line, finished, jsonl, upload

psycopg = pytest.importorskip("psycopg")


def test_a_batch_runs_once_on_one_of_two_servers(script, postgres, tmp_path):
    url = postgres.url(postgres.new_database())
    servers = [start_server(script, database_url=url, files_dir=str(tmp_path)) for _ in range(2)]
    try:
        one, other = (openai_client(s) for s in servers)
        script.script(*[f"answer {i}" for i in range(6)])
        batch = one.batches.create(input_file_id=upload(one, [chat_line(i) for i in range(6)]),
                                   endpoint="/v1/chat/completions", completion_window="24h")
        done = finished(other, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 6
        assert len(script.calls) == 6   # each line was generated once, by one server
        out = jsonl(one, done.output_file_id)
        assert sorted(o["custom_id"] for o in out) == sorted(f"req-{i}" for i in range(6))
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM batch_lines").fetchone()[0] == 6
    finally:
        for server in servers:
            server.stop()
