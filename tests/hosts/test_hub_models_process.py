"""`python -m openai_ext` with models from the hub, as a user runs it: `--model org/repo:QUANT`
and the `models` setting fetched from a local stand-in of the hub (support/hub.py) by
huggingface_hub into a cache of the test's own, a models_dir beside them, every API naming each
model, the least recently used one unloaded past max_loaded_models, and a second start served
from the cache with the hub gone and HF_HUB_OFFLINE set."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from support import processes
from support.anthropic_types import anthropic_client
from support.hub import Hub, Repo
from support.processes import stop
from support.servers import openai_client
from support.spec import assert_valid
from support.tiny_mmproj import build
from support.vision import data_url

from openai_ext.hosts.files import default_gguf

pytestmark = pytest.mark.slow

FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture
def stand_in(tmp_path):
    projector = build(tmp_path / "projector.gguf")   # a repo with a vision projector beside its model
    served = Hub({"org/SmolLM2-GGUF": Repo({FILE: default_gguf(), "SmolLM2-135M-Instruct-Q8_0.gguf": default_gguf(),
                                            "mmproj-SmolLM2-135M-Instruct-f16.gguf": projector,
                                            "README.md": default_gguf()})}).start()
    yield served
    served.stop()


def test_models_from_the_hub_by_name_in_every_api(tmp_path, stand_in):
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / "local-smol.gguf").symlink_to(default_gguf())
    (models_dir / "plain.gguf").symlink_to(default_gguf())
    build(models_dir / "mmproj-local-smol-f16.gguf")   # found beside local-smol by its name; not plain's
    cache = tmp_path / "hub"
    env = {"HF_ENDPOINT": stand_in.url, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": None}
    flags = ("--model", "org/SmolLM2-GGUF:q4_1", "--models", json.dumps({"second": f"org/SmolLM2-GGUF/{FILE}"}),
             "--models-dir", str(models_dir), "--max-loaded-models", "2", "--keep-alive", "-1", "--n-ctx", "2048")
    served = processes.serve(tmp_path, *flags, env=env)
    try:
        log = served.output()
        assert "Fetching" in log and "100% of" in log   # progress in the log, beside the console's bar
        assert stand_in.fetched("SmolLM2-135M-Instruct-Q8_0.gguf") == []   # only the quant asked for
        client = openai_client(served, timeout=300)
        ids = [m.id for m in client.models.list()]
        assert ids[:4] == ["SmolLM2-135M-Instruct-Q4_1", "local-smol", "plain", "second"]
        info = httpx.get(f"{served.url}/internal/model/info").json()
        assert info["mmproj"] == "mmproj-SmolLM2-135M-Instruct-f16.gguf"   # fetched with the model, and loaded
        image = [{"type": "image_url", "image_url": {"url": data_url("red", size=(40, 30))}},
                 {"type": "text", "text": "What is this?"}]
        for model in ("gpt-4o", "local-smol"):   # the default model, and a catalog model with its projector
            seen = client.chat.completions.create(model=model, max_tokens=4,
                                                  messages=[{"role": "user", "content": image}])
            assert seen.usage.prompt_tokens > 0
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="plain", max_tokens=4, messages=[{"role": "user", "content": image}])
        assert "has no vision" in refused.value.body["message"]

        chat = client.chat.completions.with_raw_response.create(
            model="second", max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
        assert_valid("CreateChatCompletionResponse", chat.http_response.json())
        assert chat.parse().model == "second"
        health = httpx.get(f"http://127.0.0.1:{served.port}/health").json()
        assert [m["id"] for m in health["models"]] == ["second"]   # plain and local-smol gave way, in turn

        completion = client.completions.create(model="local-smol", prompt="Once upon a time", max_tokens=8)
        assert completion.model == "local-smol" and completion.usage.completion_tokens > 0
        health = httpx.get(f"http://127.0.0.1:{served.port}/health").json()
        assert [m["id"] for m in health["models"]] == ["local-smol"]   # second was the least recently used

        response = client.responses.create(model="second", input="Say hello.", max_output_tokens=16)
        assert response.model == "second" and response.status in ("completed", "incomplete")
        message = anthropic_client(served, timeout=300).messages.create(
            model="local-smol", max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
        assert message.model == "local-smol" and message.usage.output_tokens > 0
        default = client.chat.completions.create(model="gpt-4o", max_tokens=4,
                                                 messages=[{"role": "user", "content": "Hello"}])
        assert default.model == "SmolLM2-135M-Instruct-Q4_1" and default.usage.completion_tokens > 0
        assert "Unloading second (to make room for local-smol)" in served.output()
    finally:
        stop(served)

    # Again with the hub gone and offline: the cache serves, and nothing is fetched.
    stand_in.stop()
    asked = len(stand_in.requests)
    again = processes.serve(tmp_path, *flags, env={**env, "HF_HUB_OFFLINE": "1"})
    try:
        answer = openai_client(again, timeout=300).chat.completions.create(
            model="second", max_tokens=4, messages=[{"role": "user", "content": "Hello"}])
        assert answer.model == "second" and len(stand_in.requests) == asked
    finally:
        stop(again)


def test_a_reference_that_does_not_resolve_stops_the_start_saying_why(tmp_path, stand_in):
    import subprocess
    import sys

    from support import ROOT

    env = {**processes.os.environ, "HF_ENDPOINT": stand_in.url, "HF_HUB_CACHE": str(tmp_path / "hub"),
           "PYTHONPATH": str(ROOT)}
    env.pop("HF_HUB_OFFLINE", None)
    for ref, told in (("org/SmolLM2-GGUF:Q5_K_M", "Quantizations there: Q4_1, Q8_0"),
                      ("org/Missing-GGUF", "There is no model org/Missing-GGUF on the hub")):
        proc = subprocess.run([sys.executable, "-m", "openai_ext", "--model", ref, "--port", "0"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and told in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
