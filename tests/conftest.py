"""Shared fixtures: the real embedded model, and API servers on free ports around it."""

from __future__ import annotations

import importlib
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openai_ext.app import create_app  # noqa: E402
from openai_ext.config import Settings  # noqa: E402
from openai_ext.server import ApiServer  # noqa: E402


@pytest.fixture(scope="session")
def llama_host():
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.model_files import default_gguf

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


def openai_client(server, **kw):
    from openai import OpenAI

    return OpenAI(base_url=server.url, api_key=kw.pop("api_key", "dummy"), max_retries=0,
                  _strict_response_validation=True, timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture
def client(live):
    return openai_client(live)


def has_ipv6_loopback() -> bool:
    """Whether this machine can bind ::1 (some containers have no IPv6)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


DOUBLE = Path(__file__).parent / "doubles" / "textgen_webui"


@pytest.fixture
def host_modules(monkeypatch):
    """Imports the double of the host's `modules` package, fresh for each test."""
    monkeypatch.syspath_prepend(str(DOUBLE))
    for name in [n for n in sys.modules if n == "modules" or n.startswith("modules.")]:
        monkeypatch.delitem(sys.modules, name)
    mods = SimpleNamespace(**{name: importlib.import_module(f"modules.{name}")
                              for name in ("shared", "text_generation", "chat", "models", "utils", "LoRA",
                                           "loaders", "models_settings")})
    yield mods
    for name in [n for n in sys.modules if n == "modules" or n.startswith("modules.")]:
        sys.modules.pop(name, None)


