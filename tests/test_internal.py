"""/v1/internal/*: tokens, model info, stopping, and admin-only model management, in both modes."""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest

ADMIN = {"Authorization": "Bearer admin-secret"}
USER = {"Authorization": "Bearer user-secret"}


def test_encode_decode_and_count_use_the_model_tokenizer(live, llama_host):
    text = "Hello, world! Dragons 🐉"
    enc = httpx.post(f"{live.url}/internal/encode", json={"text": text}).json()
    assert enc["tokens"] == llama_host.tokenize(text) and enc["length"] == len(enc["tokens"])
    assert httpx.post(f"{live.url}/internal/decode", json={"tokens": enc["tokens"]}).json() == {"text": text}
    assert httpx.post(f"{live.url}/internal/token-count", json={"text": text}).json() == {"length": enc["length"]}
    bad = httpx.post(f"{live.url}/internal/decode", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_chat_prompt_shows_the_rendered_prompt(live):
    r = httpx.post(f"{live.url}/internal/chat-prompt", json={"messages": [
        {"role": "system", "content": "Rule."}, {"role": "user", "content": "Hi"}]})
    assert r.json()["prompt"] == "<|im_start|>system\nRule.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" \
                                 "<|im_start|>assistant\n"


def test_model_info(live, llama_host):
    info = httpx.get(f"{live.url}/internal/model/info").json()
    # the web UI's own shape, and no path of the server's machine
    assert (info["model_name"], info["lora_names"], info["loader"]) == (llama_host.model_id, [], "llama.cpp")
    assert info["file"] == llama_host.path.name and str(llama_host.path.parent) not in str(info)


def test_stop_generation_ends_a_running_stream(live):
    body = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 1500,
            "stream": True, "ban_eos_token": True}
    stopper = threading.Timer(0.5, lambda: httpx.post(f"{live.url}/internal/stop-generation"))
    stopper.start()
    started = time.monotonic()
    r = httpx.post(f"{live.url}/chat/completions", json=body, timeout=120)
    assert time.monotonic() - started < 10
    assert r.text.rstrip().endswith("data: [DONE]") and '"finish_reason":"stop"' in r.text


@pytest.fixture
def models_dir(tmp_path, llama_host):
    # a second model file in the folder: the same weights under another name
    shutil.copy(llama_host.path, tmp_path / "Second-Model.Q4_1.gguf")
    (tmp_path / "notes.txt").write_text("not a model")
    return tmp_path


@pytest.fixture
def managed(models_dir, make_server):
    from openai_ext.config import Settings
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.model_manager import StandaloneModels
    from openai_ext.model_files import default_gguf

    settings = Settings(port=0, models_dir=str(models_dir), api_key="user-secret", admin_key="admin-secret")
    make_host = lambda path: LlamaCppHost(path, n_ctx=512)  # noqa: E731
    host = make_host(default_gguf())
    manager = StandaloneModels(settings, make_host, extra={host.path.name: host.path})
    from openai_ext.app import create_app
    from openai_ext.server import ApiServer

    server = ApiServer(create_app(settings, host, manager), settings).start()
    yield server
    server.stop()
    server.app.state.api.host.close()


def test_model_management_needs_the_admin_key(managed):
    for method, path, body in [("GET", "/internal/model/list", None),
                               ("POST", "/internal/model/load", {"model_name": "Second-Model.Q4_1"}),
                               ("POST", "/internal/model/unload", None)]:
        for headers in ({}, USER):
            r = httpx.request(method, managed.url + path, json=body, headers=headers)
            assert r.status_code == 401, (path, headers)
    # ordinary internal routes take the ordinary key
    assert httpx.post(managed.url + "/internal/token-count", json={"text": "a"}, headers=USER).status_code == 200


def test_list_load_and_unload_gguf_files_from_the_models_folder(managed):
    names = httpx.get(managed.url + "/internal/model/list", headers=ADMIN).json()["model_names"]
    assert names == ["Second-Model.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"]

    r = httpx.post(managed.url + "/internal/model/load", json={"model_name": "Second-Model.Q4_1"}, headers=ADMIN,
                   timeout=120)
    assert r.json() == "OK"
    assert [m["id"] for m in httpx.get(managed.url + "/models", headers=USER).json()["data"]][0] == \
        "Second-Model.Q4_1"
    chat = httpx.post(managed.url + "/chat/completions", headers=USER, timeout=60,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert chat.json()["model"] == "Second-Model.Q4_1"

    assert httpx.post(managed.url + "/internal/model/unload", headers=ADMIN).json() == "OK"
    health = httpx.get(managed.url.removesuffix("/v1") + "/health")
    assert health.status_code == 503
    r = httpx.post(managed.url + "/chat/completions", headers=USER,
                   json={"messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503 and "model/load" in r.json()["error"]["message"]

    r = httpx.post(managed.url + "/internal/model/load", json={"model_name": "SmolLM2-135M-Instruct.Q4_1.gguf"},
                   headers=ADMIN, timeout=120)
    assert r.json() == "OK" and httpx.get(managed.url.removesuffix("/v1") + "/health").status_code == 200


@pytest.mark.parametrize("name, status", [
    ("../../etc/passwd", 400), ("/etc/passwd", 400), ("..", 400), ("notes.txt", 404), ("missing", 404),
    ("Second-Model.Q4_1.gguf/../x", 400), ("", 400),
])
def test_model_names_cannot_escape_the_folder(managed, name, status):
    r = httpx.post(managed.url + "/internal/model/load", json={"model_name": name}, headers=ADMIN)
    assert r.status_code == status and "error" in r.json()


def test_standalone_mode_has_no_loras(managed):
    assert httpx.get(managed.url + "/internal/lora/list", headers=ADMIN).json() == {"lora_names": []}
    r = httpx.post(managed.url + "/internal/lora/load", headers=ADMIN, json={"lora_names": ["style-lora"]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_names"
    assert "web UI" in r.json()["error"]["message"]
    assert httpx.post(managed.url + "/internal/lora/unload", headers=ADMIN).json() == "OK"


@pytest.fixture
def ext_server(host_modules, make_server):
    from openai_ext.hosts.textgen import TextgenHost
    from openai_ext.model_manager import TextgenModels

    from openai_ext.app import create_app
    from openai_ext.config import Settings
    from openai_ext.server import ApiServer

    host = TextgenHost(host_modules)
    settings = Settings(port=0, admin_key="admin-secret")
    server = ApiServer(create_app(settings, host, TextgenModels(host_modules)), settings).start()
    yield server
    server.stop()


def test_extension_mode_model_management_calls_the_host_loader(ext_server, host_modules):
    base = ext_server.url
    assert httpx.get(base + "/internal/model/list", headers=ADMIN).json()["model_names"] == \
        host_modules.utils.AVAILABLE_MODELS
    r = httpx.post(base + "/internal/model/load", headers=ADMIN,
                   json={"model_name": "Other-Model-3B-Instruct.Q5_K_M.gguf", "args": {"loader": "llama.cpp"}})
    assert r.json() == "OK"
    assert host_modules.models.LOADS[-1] == "Other-Model-3B-Instruct.Q5_K_M.gguf"
    assert httpx.get(base + "/internal/model/info").json()["model_name"] == "Other-Model-3B-Instruct.Q5_K_M.gguf"
    bad = httpx.post(base + "/internal/model/load", headers=ADMIN,
                     json={"model_name": "Other-Model-3B-Instruct.Q5_K_M.gguf", "args": {"trust_remote_code": True}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "args.trust_remote_code"
    assert httpx.post(base + "/internal/model/unload", headers=ADMIN).json() == "OK"
    assert host_modules.shared.model is None
    assert httpx.get(base.removesuffix("/v1") + "/health").status_code == 503


def test_extension_mode_load_applies_loader_settings_like_the_model_tab(ext_server, host_modules):
    base, shared = ext_server.url, host_modules.shared
    other = "Other-Model-3B-Instruct.Q5_K_M.gguf"
    # the model's own settings are applied, then the request's loader settings
    r = httpx.post(base + "/internal/model/load", headers=ADMIN, json={"model_name": other, "args": {"threads": 6}})
    assert r.json() == "OK" and host_modules.models_settings.CALLS[-1] == other
    assert (shared.args.ctx_size, shared.args.gpu_layers, shared.args.threads) == (8192, 33, 6)
    # a later load starts from the startup values: the earlier request's threads do not leak
    httpx.post(base + "/internal/model/load", headers=ADMIN, json={"model_name": "Double-Model-1B-Instruct.Q4_K_M.gguf"})
    assert (shared.args.ctx_size, shared.args.threads) == (4096, 0)
    # only the Model tab's loader settings: no paths, no network or security flags; nothing changes
    before = vars(shared.args).copy()
    loads = len(host_modules.models.LOADS)
    for key, value in [("model_dir", "/tmp/attacker"), ("listen", True), ("api_key", ""), ("extra_flags", "x=1")]:
        bad = httpx.post(base + "/internal/model/load", headers=ADMIN, json={"model_name": other, "args": {key: value}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == f"args.{key}", key
    assert vars(shared.args) == before and len(host_modules.models.LOADS) == loads and shared.model is not None


def test_extension_mode_loras(ext_server, host_modules):
    base = ext_server.url
    assert httpx.get(base + "/internal/lora/list", headers=ADMIN).json() == {"lora_names": ["facts-lora", "style-lora"]}
    assert httpx.post(base + "/internal/lora/load", headers=ADMIN, json={"lora_names": ["style-lora"]}).json() == "OK"
    assert host_modules.shared.lora_names == ["style-lora"]
    assert httpx.get(base + "/internal/model/info").json()["lora_names"] == ["style-lora"]
    bad = httpx.post(base + "/internal/lora/load", headers=ADMIN, json={"lora_names": ["../evil"]})
    assert bad.status_code == 400
    assert httpx.post(base + "/internal/lora/unload", headers=ADMIN).json() == "OK"
    assert host_modules.shared.lora_names == []
