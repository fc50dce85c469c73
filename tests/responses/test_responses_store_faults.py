"""The store failing under a server that keeps serving: a real PostgreSQL cluster of the tests' own,
stopped, frozen (SIGSTOP: its port accepts, nothing answers) and started again while responses run,
driven with the OpenAI SDK and read raw, every body and event validated against OpenAI's spec.

What holds: a client told ``completed`` finds its response stored (a response whose end cannot be
stored is told failed, naming the store); no row stays queued or in progress once the store is back;
a frozen store answers the requests that need it with a prompt 503 and holds no other request; the
server finds the store again by itself."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from support.responses_api import create, parse_events
from support.scripted import Reply
from support.servers import openai_client, start_server, wait_until
from support.spec import assert_valid, error_of

psycopg = pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def cluster():
    """A PostgreSQL server of this module's own: its tests stop and freeze it."""
    from support.postgres import started

    yield from started()


@pytest.fixture
def running(cluster):
    """The cluster up at the start of each test, whatever the last one left."""
    cluster.thaw()
    if not cluster.started:
        cluster.launch()
    return cluster


def health(server) -> dict:
    return httpx.get(server.url.removesuffix("/v1") + "/health", timeout=30).json()


def gated(n: int) -> tuple[threading.Event, list[Reply]]:
    """n replies that each wait, after their first token, until the gate opens."""
    gate = threading.Event()
    return gate, [Reply("One two three four five.", gate=gate, gate_at=1) for _ in range(n)]


class Stream:
    """A Responses stream read as it comes, on a thread: ``begun`` once response.created has
    arrived (the response's row is written by then), ``events`` once it has ended."""

    def __init__(self, server, body: dict, path: str | None = None):
        """POSTs ``body`` as a new stream, or (``path``) GETs a background response's stream."""
        self.begun = threading.Event()
        self.raw = ""
        self.events: list[dict] = []
        self.thread = threading.Thread(target=self._read, args=(server, body, path), daemon=True)
        self.thread.start()

    def _read(self, server, body: dict, path: str | None) -> None:
        method, url = ("GET", server.url + path) if path else ("POST", f"{server.url}/responses")
        payload = None if path else {"model": "x", "stream": True, "input": "Count.", "max_output_tokens": 32, **body}
        with httpx.stream(method, url, timeout=120, json=payload) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                self.raw += line + "\n"
                if line.startswith("data:") and not self.begun.is_set():
                    self.begun.set()
        self.events = parse_events(self.raw)

    def end(self) -> list[dict]:
        self.thread.join(120)
        assert not self.thread.is_alive()
        return self.events


def test_a_stream_is_told_completed_only_once_its_response_is_stored(running, scripted_host, script):
    """The store stops while six stored responses stream: none is told completed; each is told it
    failed, naming the store. Once the store is back, each is stored as failed (none stays in
    progress), by the server itself, and can be continued from."""
    gate, replies = gated(6)
    script.script(*replies)
    server = start_server(scripted_host, database_url=running.url(running.new_database()), database_timeout=2)
    try:
        client = openai_client(server)
        streams = [Stream(server, {}) for _ in range(6)]
        for s in streams:
            assert s.begun.wait(60)   # each has its row: it was begun, in progress
        running.halt()
        gate.set()
        ids = []
        for s in streams:
            events = s.end()
            types = [e["type"] for e in events]
            assert "response.completed" not in types
            assert types[-2:] == ["error", "response.failed"], types
            assert events[-2]["code"] == "store_unavailable" and "database_url" in events[-2]["message"]
            failed = events[-1]["response"]
            assert failed["status"] == "failed" and "could not be stored" in failed["error"]["message"]
            ids.append(failed["id"])
        running.launch()
        # the ends owed to the store are written by the server itself, with no request needed
        wait_until(lambda: health(server)["store"]["ok"], "the store answers again", tries=600)
        for rid in ids:
            wait_until(lambda rid=rid: client.responses.retrieve(rid).status != "in_progress", f"{rid} is settled",
                       tries=600)
            body = client.responses.with_raw_response.retrieve(rid).http_response.json()
            assert_valid("Response", body)
            assert body["status"] == "failed" and body["error"]["code"] == "server_error"
        follow, _ = create(client, previous_response_id=ids[0], input="Again.", max_output_tokens=200)
        assert follow.status == "completed"
        assert client.responses.retrieve(follow.id).status == "completed"   # told completed: stored
    finally:
        gate.set()
        server.stop()


def test_background_responses_whose_store_stops_are_settled_and_cancellable(running, scripted_host, script):
    """A background response runs, another waits in line behind it, and the store stops: the
    waiting one is cancelled on the server that took it; the running one ends, told failed. Once
    the store is back neither stays queued or in progress, and cancelling either answers at once
    with how it ended."""
    gate, replies = gated(1)
    script.script(*replies)
    server = start_server(scripted_host, database_url=running.url(running.new_database()), database_timeout=2)
    try:
        client = openai_client(server)
        first, _ = create(client, input="Count.", max_output_tokens=32, background=True)
        second, _ = create(client, input="Count again.", max_output_tokens=32, background=True)
        assert replies[0].started.wait(60)   # the first generates; the second waits in line
        assert client.responses.retrieve(second.id).status == "queued"
        following = Stream(server, {}, path=f"/responses/{first.id}?stream=true")
        assert following.begun.wait(60)
        running.halt()
        cancelled = client.responses.cancel(second.id)   # it runs here: stopped here, store or not
        assert cancelled.status == "cancelled"
        gate.set()
        assert [e["type"] for e in following.end()][-2:] == ["error", "response.failed"]
        with pytest.raises(openai.InternalServerError) as e:
            client.with_options(max_retries=0).responses.retrieve(first.id)
        assert e.value.status_code == 503 and e.value.body["code"] == "store_unavailable"
        running.launch()
        wait_until(lambda: health(server)["store"]["ok"], "the store answers again", tries=600)
        for rid, status in ((first.id, "failed"), (second.id, "cancelled")):
            wait_until(lambda rid=rid, status=status: client.responses.retrieve(rid).status == status,
                       f"{rid} is {status}", tries=600)
            again = client.responses.with_raw_response.cancel(rid).http_response.json()
            assert_valid("Response", again)
            assert again["status"] == status
    finally:
        gate.set()
        server.stop()


def test_a_frozen_store_holds_only_the_requests_that_need_it(running, scripted_host, script):
    """With the database frozen, a stored response waits on it (its deadline is long here); a
    chat, a store: false response and health sent after it are answered meanwhile. Thawed, the
    stored one is answered too."""
    server = start_server(scripted_host, database_url=running.url(running.new_database()), database_timeout=120)
    try:
        client = openai_client(server)
        create(client, input="Warm the pool up.", max_output_tokens=200)
        running.freeze()
        stored: dict = {}

        def ask() -> None:
            stored["response"] = create(client, input="Stored, please.", max_output_tokens=200)[0]

        waiting = threading.Thread(target=ask, daemon=True)
        waiting.start()
        wait_until(lambda: health(server)["queued"] == 1, "the stored request waits on the store", tries=600)
        chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
        assert chat.choices[0].message.content
        alone, _ = create(client, input="Not stored.", max_output_tokens=200, store=False)
        assert alone.status == "completed"
        assert "response" not in stored and waiting.is_alive()   # still waiting on the frozen store
        running.thaw()
        waiting.join(120)
        assert stored["response"].status == "completed"
        assert client.responses.retrieve(stored["response"].id).status == "completed"
    finally:
        running.thaw()
        server.stop()


def test_a_frozen_store_is_a_prompt_503_and_is_found_again_by_itself(running, scripted_host, script):
    """Past database_timeout, a request that needs the frozen store gets a 503 naming it (and the
    setting), readiness says the store is unavailable while chat is still served; thawed, the
    server finds the store again with no request needed."""
    server = start_server(scripted_host, database_url=running.url(running.new_database(), password="hunter2"),
                   database_timeout=1)
    try:
        client = openai_client(server).with_options(max_retries=0)
        kept, _ = create(client, input="Keep me.", max_output_tokens=200)
        running.freeze()
        for call in (lambda: client.responses.retrieve(kept.id),
                     lambda: client.responses.create(model="x", input="Stored.", max_output_tokens=200),
                     lambda: client.conversations.create()):
            with pytest.raises(openai.InternalServerError) as e:
                call()
            err = error_of(e.value.response, 503)
            assert err["code"] == "store_unavailable" and "database_timeout" in err["message"]
            assert "hunter2" not in err["message"] and e.value.response.headers["retry-after"]
        r = httpx.get(server.url.removesuffix("/v1") + "/health", timeout=30)
        assert r.status_code == 503 and r.json()["status"] == "store unavailable"
        assert httpx.get(server.url.removesuffix("/v1") + "/health/live", timeout=30).status_code == 200
        chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
        assert chat.choices[0].message.content
        running.thaw()
        wait_until(lambda: health(server)["store"]["ok"], "the store answers again", tries=600)
        assert client.responses.retrieve(kept.id).id == kept.id
        assert httpx.get(server.url.removesuffix("/v1") + "/health", timeout=30).status_code == 200
    finally:
        running.thaw()
        server.stop()


def test_rows_this_server_no_longer_runs_are_failed_by_its_own_sweep(running):
    """A row of this instance left in progress that it does not run (its end was never written)
    is failed by its sweep; one it runs is left alone; a cancel of such a row answers at once."""
    from openai_ext.responses.store import Store

    store = Store(database_url=running.url(running.new_database()))
    try:
        def body(i: int) -> dict:
            return {"id": f"resp_{i}", "object": "response", "created_at": 1, "status": "in_progress",
                    "background": True, "output": []}

        store.claim("resp_1")
        for i in (1, 2, 3):
            store.put_response(body(i), "", [])
        store.sweep()
        assert store.response("resp_1", None)["status"] == "in_progress"   # it runs here
        lost = store.response("resp_2", None)
        assert lost["status"] == "failed" and "Send it again" in lost["error"]["message"]
        store.release("resp_1")
        store.put_response(dict(body(4), status="queued"), "", [])
        assert store.request_cancel("resp_4", None) == "cancelled"   # not run here, not elsewhere
        assert store.response("resp_4", None)["status"] == "cancelled"
        assert store.response("resp_3", None)["status"] == "failed"   # swept too
    finally:
        store.close()


def test_a_sqlite_store_held_by_another_program_is_a_503_and_is_found_again_by_itself(scripted_host, tmp_path):
    """The default store, its file locked by another program from the start: a request that needs
    it gets a 503 naming it (never a 500), readiness says so, and once the file is free the server
    finds the store by itself."""
    import sqlite3

    from openai_ext.responses.store_sqlite import FILE

    holder = sqlite3.connect(tmp_path / FILE, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    server = start_server(scripted_host, data_dir=str(tmp_path), database_timeout=1)
    try:
        client = openai_client(server).with_options(max_retries=0)
        for call in (lambda: client.responses.retrieve("resp_0123456789abcdef"),
                     lambda: client.conversations.create()):
            with pytest.raises(openai.InternalServerError) as e:
                call()
            err = error_of(e.value.response, 503)
            assert err["code"] == "store_unavailable" and FILE in err["message"], err
        wait_until(lambda: health(server)["status"] == "store unavailable", "readiness says so", tries=600)
        holder.execute("COMMIT")
        holder.close()
        wait_until(lambda: health(server)["status"] == "ok", "the store is found again", tries=600)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve("resp_0123456789abcdef")
        assert create(client, input="Now it keeps.", max_output_tokens=200)[0].status == "completed"
    finally:
        server.stop()
