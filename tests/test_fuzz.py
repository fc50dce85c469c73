"""Fuzzing the API through its own OpenAPI schema (schemathesis): a bounded number of valid and
invalid requests per operation. No answer may be a 5xx, and every error body must be the API's
own error object: OpenAI's, or Anthropic's on the Messages routes.

Two servers are fuzzed: the extension-mode server on the web UI double (fast, so many cases), and
the standalone server on the real model with a tiny context (few cases, real generation). Both
have image generation turned on, against the Stable Diffusion web UI double, so the images routes
are fuzzed too rather than answering "not configured"."""

from __future__ import annotations

import sys

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from support import DOUBLES
from support.anthropic_types import strict
from support.spec import errors

from openai_ext.core.config import Settings
from openai_ext.hosts.llamacpp import LlamaCppHost

sys.path.insert(0, str(DOUBLES / "sd_webui"))
from sd_webui_double import SdWebUiDouble  # noqa: E402

pytestmark = pytest.mark.slow

CASES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 25}


def check(response, case) -> None:
    where = f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    assert response.status_code < 500, where
    if response.status_code >= 400:
        body = response.json()
        if case.path.removeprefix("/v1").startswith("/messages"):
            from anthropic.types.shared import ErrorResponse

            strict(ErrorResponse, body)
        else:
            assert not errors("ErrorResponse", body), where


# Unloading the model is destructive by design: every later generation would rightly answer 503
# "no model loaded". Its behaviour is tested in test_internal.py.
NOT_FUZZED = {("POST", "/v1/internal/model/unload")}


def fuzz(base_url: str, cases: dict[GenerationMode, int]) -> int:
    schema = schemathesis.openapi.from_url(f"{base_url.removesuffix('/v1')}/openapi.json")
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in NOT_FUZZED:
            continue
        for mode, count in cases.items():
            @settings(max_examples=count, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(operation.as_strategy(generation_mode=mode))
            def one(case):
                nonlocal ran
                ran += 1
                check(case.call(base_url=base_url.removesuffix("/v1"), timeout=60), case)
            try:
                one()
            except Unsatisfiable:
                # nothing to make invalid (an operation without parameters or body)
                assert mode is GenerationMode.NEGATIVE
    return ran


@pytest.fixture(scope="module")
def sd():
    double = SdWebUiDouble()
    yield double
    double.close()


def test_fuzz_extension_mode_server(host_modules, make_server, sd, tmp_path):
    from openai_ext.hosts.manager import TextgenModels
    from openai_ext.hosts.textgen import TextgenHost

    # (a store of its own: the fuzz's uploads and stores are no other test's, nor the user's folder's)
    server = make_server(TextgenHost(host_modules), TextgenModels(host_modules), max_n=4, sd_webui_url=sd.url,
                         data_dir=str(tmp_path))
    ran = fuzz(server.url, CASES)
    assert ran >= 100


@pytest.fixture(scope="module")
def tiny_host():
    from openai_ext.hosts.files import default_gguf

    host = LlamaCppHost(default_gguf(), n_ctx=96)
    yield host
    host.close()


def test_fuzz_standalone_server_on_the_real_model(tiny_host, make_server, sd, tmp_path):
    from openai_ext.hosts.manager import StandaloneModels

    settings = Settings(models_dir=str(tmp_path))
    manager = StandaloneModels(settings, lambda path: LlamaCppHost(path, n_ctx=96), extra={tiny_host.path.name: tiny_host.path})
    server = make_server(tiny_host, manager, max_n=2, sd_webui_url=sd.url, models_dir=str(tmp_path),
                         data_dir=str(tmp_path / "data"))
    ran = fuzz(server.url, {GenerationMode.POSITIVE: 8, GenerationMode.NEGATIVE: 8})
    assert ran >= 30
