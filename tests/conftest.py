"""Shared fixtures: API servers on free ports around the scripted host (the fast tier) or the
real embedded model (the slow tier: any test that uses ``llama_host`` is marked slow here)."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS.parent))
sys.path.insert(0, str(TESTS))   # the shared helpers: support.*

from support import DOUBLES  # noqa: E402
from support.pieces import hook_pieces  # noqa: E402
from support.scripted import ScriptedHost  # noqa: E402
from support.servers import free_port, openai_client, run_together  # noqa: E402
from support.webui import load_extension  # noqa: E402

from openai_ext.app import create_app  # noqa: E402
from openai_ext.core.config import Settings  # noqa: E402
from openai_ext.core.server import ApiServer  # noqa: E402

MODEL_FIXTURES = ("llama_host",)


def pytest_collection_modifyitems(config, items):
    """The fast tier loads no model: a test that needs the real one, through any fixture that
    leads to ``llama_host``, is in the slow tier whatever its own markers say."""
    for item in items:
        if any(name in item.fixturenames for name in MODEL_FIXTURES) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fast_tests_load_no_model(request, monkeypatch):
    """A test outside the slow tier that loads a GGUF model anyway (a fixture asked for by name
    at run time, a host built in the test) fails, naming the rule."""
    if request.node.get_closest_marker("slow") is not None:
        return
    from openai_ext.hosts.llamacpp import context as llamacpp_context

    def refuse(*args, **kwargs):
        pytest.fail("a test outside the slow tier loaded a model: mark it slow, or use the scripted host "
                    "(fixtures scripted, sclient, script)", pytrace=False)
    monkeypatch.setattr(llamacpp_context, "load_model", refuse)   # (Runtime loads every model through it)


@pytest.fixture(scope="session")
def llama_host():
    """The real SmolLM2 model (slow tier only: see pytest_collection_modifyitems)."""
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    host = LlamaCppHost(default_gguf(), n_ctx=2048)
    yield host
    host.close()


@pytest.fixture(scope="session")
def make_server():
    """Starts an API server on a free port around a host; every server is stopped at the end, all
    at once (each takes a tick of its event loop to notice)."""
    servers = []

    def make(host, manager=None, **settings) -> ApiServer:
        s = Settings(**{"port": 0, **settings})
        server = ApiServer(create_app(s, host, manager), s).start()
        servers.append(server)
        return server

    yield make
    run_together(lambda i: servers[i].stop(), len(servers))


@pytest.fixture(scope="session")
def live(llama_host, make_server):
    """The standalone API on the real SmolLM2 model."""
    return make_server(llama_host)


@pytest.fixture
def client(live):
    return openai_client(live)


@pytest.fixture(scope="session")
def scripted_host():
    """The scripted host (support/scripted.py) the fast tier's servers run on; the ``script``
    fixture sets its replies for one test."""
    return ScriptedHost()


@pytest.fixture(scope="session")
def scripted_server(scripted_host, make_server):
    return make_server(scripted_host)


@pytest.fixture
def script(scripted_host):
    """The scripted host, fresh for this test: ``script.script("reply", ...)`` queues replies,
    ``script.calls`` lists what it was asked; all of it is reset after the test. A reply the test
    scripted and no request asked for is an error: the test did not run as it was written."""
    scripted_host.reset()
    yield scripted_host
    unused = [r.text[:40] for r in scripted_host.replies]
    scripted_host.reset()
    assert not unused, f"scripted replies no request asked for: {unused}"


@pytest.fixture
def scripted(scripted_server, script):
    """The standalone API on the scripted host, its script reset for this test."""
    return scripted_server


@pytest.fixture(scope="session")
def scripted_openai(scripted_server):
    """One client for the session (a client costs tens of milliseconds to make)."""
    return openai_client(scripted_server)


@pytest.fixture
def sclient(scripted, scripted_openai):
    return scripted_openai


def _failing(host, monkeypatch):
    plan = {"after": 0}

    def piece(i, _piece):
        if i == plan["after"]:
            raise RuntimeError("simulated failure inside the model")
    hook_pieces(host, monkeypatch, piece=piece)
    return plan


@pytest.fixture
def failing_host(llama_host, monkeypatch):
    """The real host, made to fail after ``after`` pieces (0: before the first)."""
    return _failing(llama_host, monkeypatch)


@pytest.fixture
def failing_scripted(script, monkeypatch):
    """The scripted host, made to fail after ``after`` pieces (0: before the first)."""
    return _failing(script, monkeypatch)


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of its own for the session (Debian's postgresql package; .ci/run
    installs it); the tests that need one are skipped, with the reason, without it."""
    from support.postgres import started

    yield from started()


@pytest.fixture
def pg_url(postgres):
    """The URL of a new, empty database on the session's PostgreSQL server."""
    return postgres.url(postgres.new_database())


DOUBLE = DOUBLES / "textgen_webui"


@pytest.fixture
def host_modules(monkeypatch):
    """Imports the double of the host's `modules` package, fresh for each test."""
    monkeypatch.syspath_prepend(str(DOUBLE))
    for name in [n for n in list(sys.modules) if n == "modules" or n.startswith("modules.")]:
        monkeypatch.delitem(sys.modules, name)
    mods = SimpleNamespace(**{name: importlib.import_module(f"modules.{name}")
                              for name in ("shared", "text_generation", "chat", "models", "utils", "LoRA",
                                           "loaders", "models_settings", "logging_colors", "logits", "presets", "reasoning",
                                           "ui_image_generation")})
    yield mods
    for name in [n for n in list(sys.modules) if n == "modules" or n.startswith("modules.")]:
        sys.modules.pop(name, None)


@pytest.fixture(scope="session")
def stop_later():
    """Stops a server on a thread of its own, joined at the end of the session: a test does not
    wait for the tick in which a server it has finished with notices that it should stop."""
    threads: list[threading.Thread] = []

    def stop(server) -> None:
        thread = threading.Thread(target=server.stop, name="test-server-stop")
        thread.start()
        threads.append(thread)
    yield stop
    for thread in threads:
        thread.join()


@pytest.fixture
def extension(host_modules, stop_later):
    """The extension loaded into the host double as the web UI loads it, on a free port."""
    host_modules.shared.settings["openai_ext-port"] = free_port()
    ext = load_extension(host_modules.shared)
    assert ext.server is not None
    yield ext
    stop_later(ext.server)


