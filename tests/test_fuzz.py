"""Fuzzing the API through its own OpenAPI schema (schemathesis): a bounded number of valid and
invalid requests per operation. No answer may be a 5xx, and every error body must be an OpenAI
error object.

Two servers are fuzzed: the extension-mode server on the web UI double (fast, so many cases), and
the standalone server on the real model with a tiny context (few cases, real generation)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from openai_spec import errors

CASES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 25}


def check(response, case) -> None:
    where = f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    assert response.status_code < 500, where
    if response.status_code >= 400:
        body = response.json()
        assert not errors("ErrorResponse", body), where


def fuzz(base_url: str, cases: dict[GenerationMode, int]) -> int:
    schema = schemathesis.openapi.from_url(f"{base_url.removesuffix('/v1')}/openapi.json")
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()
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


def test_fuzz_extension_mode_server(host_modules, make_server):
    from openai_ext.hosts.textgen import TextgenHost

    server = make_server(TextgenHost(host_modules), max_n=4)
    ran = fuzz(server.url, CASES)
    assert ran >= 100


@pytest.fixture(scope="module")
def tiny_host():
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.model_files import default_gguf

    host = LlamaCppHost(default_gguf(), n_ctx=96)
    yield host
    host.close()


def test_fuzz_standalone_server_on_the_real_model(tiny_host, make_server):
    server = make_server(tiny_host, max_n=2)
    ran = fuzz(server.url, {GenerationMode.POSITIVE: 8, GenerationMode.NEGATIVE: 8})
    assert ran >= 30
