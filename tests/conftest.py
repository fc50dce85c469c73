"""Shared fixtures: the real embedded model, and API servers on free ports around it."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS.parent))
sys.path.insert(0, str(TESTS))   # the shared helpers: support.*

from support import DOUBLES  # noqa: E402
from support.servers import free_port, openai_client  # noqa: E402
from support.webui import load_extension  # noqa: E402

from openai_ext.app import create_app  # noqa: E402
from openai_ext.core.config import Settings  # noqa: E402
from openai_ext.core.server import ApiServer  # noqa: E402


@pytest.fixture(scope="session")
def llama_host():
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost

    host = LlamaCppHost(default_gguf(), n_ctx=2048)
    yield host
    host.close()


@pytest.fixture(scope="session")
def make_server():
    """Starts an API server on a free port around a host; every server is stopped at the end."""
    servers = []

    def make(host, manager=None, **settings) -> ApiServer:
        s = Settings(**{"port": 0, **settings})
        server = ApiServer(create_app(s, host, manager), s).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def live(llama_host, make_server):
    """The standalone API on the real SmolLM2 model."""
    return make_server(llama_host)


@pytest.fixture
def client(live):
    return openai_client(live)


@pytest.fixture
def failing_host(llama_host, monkeypatch):
    """The real host, made to fail after ``after`` pieces (0: before the first)."""
    real = llama_host.generate
    plan = {"after": 0}

    def generate(prompt, settings, stop_event):
        for i, piece in enumerate(real(prompt, settings, stop_event)):
            if i == plan["after"]:
                raise RuntimeError("simulated failure inside the model")
            yield piece
    monkeypatch.setattr(llama_host, "generate", generate)
    return plan


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of its own for the session (Debian's postgresql package; .ci/run
    installs it); the tests that need one are skipped, with the reason, without it."""
    from support.postgres import PostgresServer, binaries

    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -r requirements-dev.txt)")
    found = binaries()
    if found is None:
        pytest.skip("PostgreSQL is not installed (initdb and pg_ctl not found; Debian: apt-get install postgresql)")
    server = PostgresServer(found)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture
def pg_url(postgres):
    """The URL of a new, empty database on the session's PostgreSQL server."""
    return postgres.url(postgres.new_database())


DOUBLE = DOUBLES / "textgen_webui"


@pytest.fixture
def host_modules(monkeypatch):
    """Imports the double of the host's `modules` package, fresh for each test."""
    monkeypatch.syspath_prepend(str(DOUBLE))
    for name in [n for n in sys.modules if n == "modules" or n.startswith("modules.")]:
        monkeypatch.delitem(sys.modules, name)
    mods = SimpleNamespace(**{name: importlib.import_module(f"modules.{name}")
                              for name in ("shared", "text_generation", "chat", "models", "utils", "LoRA",
                                           "loaders", "models_settings", "logging_colors", "logits", "presets", "reasoning",
                                           "ui_image_generation")})
    yield mods
    for name in [n for n in sys.modules if n == "modules" or n.startswith("modules.")]:
        sys.modules.pop(name, None)


@pytest.fixture
def extension(host_modules):
    """The extension loaded into the host double as the web UI loads it, on a free port."""
    host_modules.shared.settings["openai_ext-port"] = free_port()
    ext = load_extension(host_modules.shared)
    assert ext.server is not None
    yield ext
    ext.server.stop()


