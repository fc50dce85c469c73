"""Two servers sharing one PostgreSQL store, driven with the OpenAI SDK: a chain started on one
continues on the other, turns appended at once through both are all kept in order, and a
background response runs on one server only and is cancelled through the other."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from support.responses_api import create, parse_events, poll
from support.scripted import held
from support.servers import idle, openai_client, run_together, start_server, wait_until
from support.spec import assert_valid, error_of

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def shared(scripted_host, postgres):
    """Two servers on one new database; stopped before the PostgreSQL server is."""
    url = postgres.url(postgres.new_database(), password="hunter2")
    servers = [start_server(scripted_host, database_url=url), start_server(scripted_host, database_url=url)]
    yield servers, url
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def clients(shared):
    return [openai_client(server) for server in shared[0]]


def test_a_chain_started_on_one_server_continues_on_the_other(clients):
    a, b = clients
    first, _ = create(a, input="My name is Ada.", max_output_tokens=16)
    alone, _ = create(b, input="What is my name?", max_output_tokens=16, store=False)
    follow, body = create(b, previous_response_id=first.id, input="What is my name?", max_output_tokens=16)
    assert body["previous_response_id"] == first.id
    assert follow.usage.input_tokens > alone.usage.input_tokens   # the first turn is in the prompt
    assert a.responses.retrieve(follow.id).previous_response_id == first.id
    assert [i.type for i in a.responses.input_items.list(follow.id).data] == ["message"]


def test_turns_appended_at_once_through_both_servers_are_all_kept_in_order(clients):
    a, b = clients
    conv = a.conversations.create(metadata={"shared": "yes"})
    assert b.conversations.retrieve(conv.id).metadata == {"shared": "yes"}
    barrier = threading.Barrier(2)

    def add(w: int) -> None:
        barrier.wait()
        for k in range(8):
            clients[w].conversations.items.create(conv.id, items=[
                {"type": "message", "role": "user", "content": f"{w}-{k}-{part}"} for part in range(2)])

    run_together(add, 2)
    texts = [i.content[0].text for i in b.conversations.items.list(conv.id, order="asc", limit=100).data]
    assert len(texts) == 32
    pairs = [texts[i:i + 2] for i in range(0, 32, 2)]
    assert all(p[0][:-1] == p[1][:-1] and p[0].endswith("0") and p[1].endswith("1") for p in pairs)   # whole turns
    for w in "01":
        assert [p[0].split("-")[1] for p in pairs if p[0][0] == w] == [str(k) for k in range(8)]

    # two responses in the conversation at once, one through each server: both turns kept, each whole
    answers = [None, None]

    def respond(w: int) -> None:
        barrier.wait()
        answers[w] = create(clients[w], conversation=conv.id, input=f"turn {w}", max_output_tokens=16)[0]

    run_together(respond, 2)
    items = a.conversations.items.list(conv.id, order="asc", limit=100).data[32:]
    assert len(items) == 4
    for k in (0, 2):
        turn = items[k:k + 2]
        w = int(turn[0].content[0].text.split()[1])
        assert turn[0].role == "user" and turn[1].id == answers[w].output[0].id


def test_a_background_response_runs_on_one_server_and_is_cancelled_through_the_other(shared, clients, script):
    [reply] = script.script(held())   # a long reply, still running until the request ends
    (server_a, server_b), url = shared
    a, b = clients
    resp, _ = create(a, input="Write a very long story about a dragon.", max_output_tokens=1500, background=True)
    running = poll(b, resp.id, lambda body: body["status"] == "in_progress")   # seen through the other server
    assert reply.started.wait(60)   # it is generating now
    assert running["background"] is True
    store_a = server_a.app.state.api.responses
    store_b = server_b.app.state.api.responses
    assert resp.id in store_a.background.runs and resp.id not in store_b.background.runs
    with psycopg.connect(url) as conn:
        runner = conn.execute("SELECT instance FROM responses WHERE id = %s", (resp.id,)).fetchone()[0]
    assert runner == store_a.store.instance_id
    # its live events are on the server that runs it: streaming it elsewhere says where to go
    err = error_of(httpx.get(f"{server_b.url}/responses/{resp.id}", params={"stream": "true"}, timeout=60), 400)
    assert err["param"] == "stream" and "another server" in err["message"]
    cancelled = b.responses.with_raw_response.cancel(resp.id).http_response.json()
    assert_valid("Response", cancelled)
    assert cancelled["status"] == "cancelled"
    assert a.responses.retrieve(resp.id).status == "cancelled"
    assert idle(server_a, script)   # the generation on the first server stopped
    assert b.responses.cancel(resp.id).status == "cancelled"   # again: unchanged
    # once it ended, any server replays its events
    replayed = parse_events(httpx.get(f"{server_b.url}/responses/{resp.id}", params={"stream": "true"},
                                      timeout=60).text)
    types = [e["type"] for e in replayed]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert "response.output_text.delta" in types and "response.completed" not in types


def test_a_database_that_goes_away_is_a_503_and_its_return_needs_no_restart(scripted_host, postgres):
    name = postgres.new_database()
    server = start_server(scripted_host, database_url=postgres.url(name, password="hunter2"))
    try:
        client = openai_client(server)
        resp, _ = create(client, input="Say hi.", max_output_tokens=16)
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            with pytest.raises(openai.InternalServerError) as e:
                client.responses.retrieve(resp.id)
            assert e.value.status_code == 503
            error = e.value.response.json()["error"]
            assert error["type"] == "server_error" and "database_url" in error["message"]
            assert "hunter2" not in error["message"] and "***" in error["message"]
            health = httpx.get(server.url.removesuffix("/v1") + "/health").json()
            assert health["status"] == "store unavailable" and not health["store"]["ok"]
            assert "hunter2" not in health["store"]["error"]
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        # found again by the store's own heartbeat, with no request needed
        wait_until(lambda: httpx.get(server.url.removesuffix("/v1") + "/health").json()["store"]["ok"],
                   "the store answers again", tries=600)
        assert client.responses.retrieve(resp.id).id == resp.id
    finally:
        server.stop()
