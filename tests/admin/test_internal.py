"""/v1/internal/*: tokens, model info, stopping, and admin-only model management, in both modes."""

from __future__ import annotations

import shutil
import threading

import httpx
import pytest
from support.scripted import held

ADMIN = {"Authorization": "Bearer admin-secret"}
USER = {"Authorization": "Bearer user-secret"}


def test_encode_decode_and_count_use_the_model_tokenizer(scripted, scripted_host):
    text = "Hello, world! Dragons 🐉"
    enc = httpx.post(f"{scripted.url}/internal/encode", json={"text": text}).json()
    assert enc["tokens"] == scripted_host.tokenize(text) and enc["length"] == len(enc["tokens"])
    assert httpx.post(f"{scripted.url}/internal/decode", json={"tokens": enc["tokens"]}).json() == {"text": text}
    assert httpx.post(f"{scripted.url}/internal/token-count", json={"text": text}).json() == {"length": enc["length"]}
    bad = httpx.post(f"{scripted.url}/internal/decode", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_chat_prompt_shows_the_rendered_prompt(scripted):
    r = httpx.post(f"{scripted.url}/internal/chat-prompt", json={"messages": [
        {"role": "system", "content": "Rule."}, {"role": "user", "content": "Hi"}]})
    assert r.json()["prompt"] == "<|im_start|>system\nRule.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" \
                                 "<|im_start|>assistant\n"


def test_model_info(live, llama_host):
    info = httpx.get(f"{live.url}/internal/model/info").json()
    # the web UI's own shape, and no path of the server's machine
    assert (info["model_name"], info["lora_names"], info["loader"]) == (llama_host.model_id, [], "llama.cpp")
    assert info["file"] == llama_host.path.name and str(llama_host.path.parent) not in str(info)
    # and what the embedded host adds: its context, shared by its sequences, and their counts
    assert info["n_ctx"] == llama_host.context_length() and info["parallel"] == llama_host.parallel
    assert info["batch"]["cells_total"] == info["n_ctx"] and {"preempted", "running", "waiting"} <= set(info["batch"])
    assert isinstance(info["extra_cpu_buffers"], bool)
    assert info["flash_attn"] is False      # one sequence: the reproducible path (flash_attn auto)


def test_stop_generation_ends_a_running_stream(scripted, script):
    body = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 1500,
            "stream": True, "ban_eos_token": True}
    [reply] = script.script(held())   # it runs until something stops it

    def stop_once_it_runs():
        reply.started.wait(60)
        httpx.post(f"{scripted.url}/internal/stop-generation")
    stopper = threading.Thread(target=stop_once_it_runs)
    stopper.start()
    r = httpx.post(f"{scripted.url}/chat/completions", json=body, timeout=120)
    stopper.join()
    assert r.text.rstrip().endswith("data: [DONE]") and '"finish_reason":"stop"' in r.text
    assert r.text.count('"content":"') < 1500   # stopped before max_tokens, not run to the end


@pytest.fixture
def models_dir(tmp_path, llama_host):
    # a second model file in the folder: the same weights under another name
    shutil.copy(llama_host.path, tmp_path / "Second-Model.Q4_1.gguf")
    (tmp_path / "notes.txt").write_text("not a model")
    return tmp_path


@pytest.fixture
def managed(models_dir, make_server):
    from openai_ext.core.config import Settings
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.hosts.manager import StandaloneModels

    settings = Settings(port=0, models_dir=str(models_dir), api_key="user-secret", admin_key="admin-secret")
    make_host = lambda path: LlamaCppHost(path, n_ctx=512)  # noqa: E731
    host = make_host(default_gguf())
    manager = StandaloneModels(settings, make_host, extra={host.path.name: host.path})
    from openai_ext.app import create_app
    from openai_ext.core.server import ApiServer

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
def ext_server(host_modules, stop_later):
    from openai_ext.app import create_app
    from openai_ext.core.config import Settings
    from openai_ext.core.server import ApiServer
    from openai_ext.hosts.manager import TextgenModels
    from openai_ext.hosts.textgen import TextgenHost

    host = TextgenHost(host_modules)
    settings = Settings(port=0, admin_key="admin-secret")
    server = ApiServer(create_app(settings, host, TextgenModels(host_modules)), settings).start()
    yield server
    stop_later(server)


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
    host_modules.shared.args.loader = "Transformers"     # the loader the web UI applies LoRAs with
    assert httpx.get(base + "/internal/lora/list", headers=ADMIN).json() == {"lora_names": ["facts-lora", "style-lora"]}
    assert httpx.post(base + "/internal/lora/load", headers=ADMIN, json={"lora_names": ["style-lora"]}).json() == "OK"
    assert host_modules.shared.lora_names == ["style-lora"]
    assert httpx.get(base + "/internal/model/info").json()["lora_names"] == ["style-lora"]
    bad = httpx.post(base + "/internal/lora/load", headers=ADMIN, json={"lora_names": ["../evil"]})
    assert bad.status_code == 400
    assert httpx.post(base + "/internal/lora/unload", headers=ADMIN).json() == "OK"
    assert host_modules.shared.lora_names == []


# --- standalone: what serves after an unload or a failed load --------------------------------

def test_after_unload_model_info_keeps_every_key(managed):
    loaded = httpx.get(managed.url + "/internal/model/info", headers=USER).json()
    # model_name is the id /v1/models shows (the file's stem); file is the name model/list gives
    assert loaded["file"] in httpx.get(managed.url + "/internal/model/list", headers=ADMIN).json()["model_names"]
    assert loaded["model_name"] == loaded["file"].removesuffix(".gguf")
    assert httpx.post(managed.url + "/internal/model/unload", headers=ADMIN).json() == "OK"
    info = httpx.get(managed.url + "/internal/model/info", headers=USER).json()
    assert info == {"model_name": "None", "lora_names": [], "loader": "llama.cpp", "file": None}
    r = httpx.post(managed.url + "/internal/encode", json={"text": "a"}, headers=USER)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"


def chat_model(server) -> httpx.Response:
    return httpx.post(server.url + "/chat/completions", headers=USER, timeout=60,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})


def test_a_load_closes_the_model_served_before_it_builds_the_next(models_dir):
    from openai_ext.app import create_app
    from openai_ext.core.config import Settings
    from openai_ext.core.server import ApiServer
    from openai_ext.hosts.files import default_gguf
    from openai_ext.hosts.llamacpp import LlamaCppHost
    from openai_ext.hosts.manager import StandaloneModels

    open_hosts, open_at_build = [], []

    def make_host(path):
        open_at_build.append(len(open_hosts))
        host = LlamaCppHost(path, n_ctx=256)
        close = host.close

        def tracked_close():
            open_hosts.remove(host)
            close()

        host.close = tracked_close
        open_hosts.append(host)
        return host

    first = make_host(default_gguf())
    settings = Settings(port=0, models_dir=str(models_dir))
    server = ApiServer(create_app(settings, first, StandaloneModels(settings, make_host)), settings).start()
    try:
        r = httpx.post(server.url + "/internal/model/load", json={"model_name": "Second-Model.Q4_1"}, timeout=120)
        assert r.json() == "OK"
        assert open_at_build == [0, 0] and len(open_hosts) == 1     # never two models in memory
    finally:
        server.stop()
        server.app.state.api.host.close()


def test_a_failed_load_serves_the_previous_model_again(managed, models_dir):
    (models_dir / "Broken.gguf").write_bytes(b"GGUF but not really a model")
    before = httpx.get(managed.url + "/internal/model/info", headers=USER).json()["model_name"]
    r = httpx.post(managed.url + "/internal/model/load", json={"model_name": "Broken"}, headers=ADMIN, timeout=120)
    assert r.status_code == 500 and r.headers.get("x-should-retry") == "false"
    error = r.json()["error"]
    assert error["code"] == "model_load_failed" and "Broken.gguf could not be loaded" in error["message"]
    assert f"{before} is served again" in error["message"]
    # the error names the file, never the folder it is in
    assert str(models_dir) not in error["message"] and "/" not in error["message"]
    assert chat_model(managed).json()["model"] == before
    assert httpx.get(managed.url.removesuffix("/v1") + "/health").status_code == 200


def test_a_model_whose_llama_cpp_crashes_is_refused_and_the_server_serves_on(managed, models_dir, monkeypatch):
    """A llama.cpp build that dies on a model whatever its buffer types (its test child really
    crashes, with them and without) would take the whole server down if the model were loaded in
    its process: the load is refused with the reason, and the model served before comes back."""
    import sys

    from openai_ext.hosts.llamacpp import probe

    monkeypatch.setenv("XDG_CACHE_HOME", str(models_dir / "cache"))    # verdicts of this test's own
    shutil.copy(models_dir / "Second-Model.Q4_1.gguf", models_dir / "Crashing.gguf")
    monkeypatch.setattr(probe, "PROBE_COMMAND", [sys.executable, "-c", (
        "import sys, ctypes; 'Crashing' in ' '.join(sys.argv) and ctypes.string_at(0); "
        f"print({probe.PROBE_OK!r})")])
    before = httpx.get(managed.url + "/internal/model/info", headers=USER).json()["model_name"]
    r = httpx.post(managed.url + "/internal/model/load", json={"model_name": "Crashing"}, headers=ADMIN, timeout=120)
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["code"] == "model_load_failed" and "Crashing.gguf could not be loaded" in error["message"]
    assert "crashed in a test child process" in error["message"] and "and without them" in error["message"]
    assert f"{before} is served again" in error["message"]
    assert chat_model(managed).json()["model"] == before
    assert httpx.get(managed.url.removesuffix("/v1") + "/health").status_code == 200


def test_a_failed_load_whose_predecessor_is_gone_too_is_a_clear_503(managed, models_dir):
    second = models_dir / "Second-Model.Q4_1.gguf"
    assert httpx.post(managed.url + "/internal/model/load", json={"model_name": second.name}, headers=ADMIN,
                      timeout=120).json() == "OK"
    second.unlink()          # the model served now can no longer be loaded again
    (models_dir / "Broken.gguf").write_bytes(b"not a model")
    r = httpx.post(managed.url + "/internal/model/load", json={"model_name": "Broken.gguf"}, headers=ADMIN,
                   timeout=120)
    assert r.status_code == 500 and "no model is loaded now" in r.json()["error"]["message"]
    r = chat_model(managed)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"
    assert httpx.get(managed.url + "/internal/model/info", headers=USER).json()["model_name"] == "None"
    # and a good load brings the server back
    assert httpx.post(managed.url + "/internal/model/load", json={"model_name": "SmolLM2-135M-Instruct.Q4_1"},
                      headers=ADMIN, timeout=120).json() == "OK"
    assert chat_model(managed).status_code == 200


def test_symlinks_in_the_models_folder_are_followed(managed, models_dir, llama_host, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    target = elsewhere / "Kept-Elsewhere.gguf"
    target.symlink_to(llama_host.path)
    (models_dir / "Linked.gguf").symlink_to(target)
    (models_dir / "Dangling.gguf").symlink_to(elsewhere / "missing.gguf")
    names = httpx.get(managed.url + "/internal/model/list", headers=ADMIN).json()["model_names"]
    assert "Linked.gguf" in names and "Dangling.gguf" not in names
    r = httpx.post(managed.url + "/internal/model/load", json={"model_name": "Linked"}, headers=ADMIN, timeout=120)
    assert r.json() == "OK" and chat_model(managed).json()["model"] == "Linked"
    info = httpx.get(managed.url + "/internal/model/info", headers=USER).json()
    assert info["file"] == "Linked.gguf" and str(elsewhere) not in str(info)


# --- extension mode ---------------------------------------------------------------------------

SUBFOLDER_MODEL = "Qwen2.5-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf"


def test_extension_mode_loads_a_model_the_host_lists_in_a_subfolder(ext_server, host_modules):
    base = ext_server.url
    assert SUBFOLDER_MODEL in httpx.get(base + "/internal/model/list", headers=ADMIN).json()["model_names"]
    r = httpx.post(base + "/internal/model/load", headers=ADMIN, json={"model_name": SUBFOLDER_MODEL})
    assert r.json() == "OK" and host_modules.models.LOADS[-1] == SUBFOLDER_MODEL
    assert httpx.get(base + "/internal/model/info").json()["model_name"] == SUBFOLDER_MODEL


@pytest.mark.parametrize("name, status", [
    ("../secret.gguf", 400), ("/etc/passwd", 400), ("Qwen2.5-GGUF/../../secret.gguf", 400),
    ("Qwen2.5-GGUF\\..\\..\\secret.gguf", 400), ("C:\\models\\x.gguf", 400), ("Qwen2.5-GGUF//x.gguf", 400),
    ("./Double-Model-1B-Instruct.Q4_K_M.gguf", 400), ("Double-Model\u0000.gguf", 400),
    ("Qwen2.5-GGUF/unlisted.gguf", 404),
])
def test_extension_mode_model_names_cannot_escape_the_folder(ext_server, host_modules, name, status):
    loads = list(host_modules.models.LOADS)
    r = httpx.post(ext_server.url + "/internal/model/load", headers=ADMIN, json={"model_name": name})
    assert r.status_code == status and r.json()["error"]["param"] == "model_name"
    # refused before the host was touched: the model it had is still loaded
    assert host_modules.models.LOADS == loads and host_modules.shared.model is not None


def test_extension_mode_a_load_the_host_fails_is_an_error_not_ok(ext_server, host_modules):
    base, shared = ext_server.url, host_modules.shared
    other = "Other-Model-3B-Instruct.Q5_K_M.gguf"
    host_modules.models.BROKEN.add(other)            # its loader logs why and gives (None, None)
    r = httpx.post(base + "/internal/model/load", headers=ADMIN, json={"model_name": other})
    assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
    assert "could not load" in r.json()["error"]["message"] and "log" in r.json()["error"]["message"]
    assert shared.model is None and shared.model_name == "None"
    assert httpx.get(base + "/internal/model/info").json()["model_name"] == "None"
    assert httpx.get(base.removesuffix("/v1") + "/health").status_code == 503
    # a loader that raises: its message comes back, without the machine's paths
    host_modules.models.RAISES[other] = OSError("cannot open /home/user/text-generation-webui/user_data/models/x")
    r = httpx.post(base + "/internal/model/load", headers=ADMIN, json={"model_name": other})
    assert r.status_code == 500 and "OSError: cannot open x" in r.json()["error"]["message"]
    # the server still serves once a load works
    good = "Double-Model-1B-Instruct.Q4_K_M.gguf"
    assert httpx.post(base + "/internal/model/load", headers=ADMIN, json={"model_name": good}).json() == "OK"
    assert httpx.get(base.removesuffix("/v1") + "/health").status_code == 200


def test_extension_mode_loras_need_a_loader_that_applies_them(ext_server, host_modules):
    base, shared, lora = ext_server.url, host_modules.shared, host_modules.LoRA
    # the host itself fails on its llama.cpp loader: that is what the check spares the client
    with pytest.raises(AttributeError):
        lora.add_lora_to_model(["style-lora"])
    lora.CALLS.clear()
    r = httpx.post(base + "/internal/lora/load", headers=ADMIN, json={"lora_names": ["style-lora"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_not_supported"
    assert "llama.cpp loader" in r.json()["error"]["message"] and "Transformers" in r.json()["error"]["message"]
    assert lora.CALLS == [] and shared.lora_names == []
    # unloading when none are applied is fine on any loader
    assert httpx.post(base + "/internal/lora/unload", headers=ADMIN).json() == "OK"

    shared.args.loader = "Transformers"
    lora.BROKEN.add("facts-lora")
    r = httpx.post(base + "/internal/lora/load", headers=ADMIN, json={"lora_names": ["facts-lora"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_failed"
    message = r.json()["error"]["message"]
    assert message.startswith("The web UI could not apply the LoRA(s): ValueError") and "/" not in message

    httpx.post(base + "/internal/model/unload", headers=ADMIN)
    r = httpx.post(base + "/internal/lora/load", headers=ADMIN, json={"lora_names": ["style-lora"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_loaded"


def test_extension_mode_tokenizer_routes_use_the_host(ext_server, host_modules):
    base = ext_server.url
    enc = httpx.post(base + "/internal/encode", json={"text": "Hi"}).json()
    assert enc == {"tokens": [256, 72, 105], "length": 3}     # the double's byte tokenizer, with its BOS
    assert httpx.post(base + "/internal/decode", json={"tokens": [72, 105]}).json() == {"text": "Hi"}
    assert httpx.post(base + "/internal/token-count", json={"text": "Hi"}).json() == {"length": 3}
    httpx.post(base + "/internal/model/unload", headers=ADMIN)
    r = httpx.post(base + "/internal/encode", json={"text": "Hi"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"


def test_extension_mode_stop_generation_calls_the_host(ext_server, host_modules):
    assert host_modules.shared.stop_everything is False
    assert httpx.post(ext_server.url + "/internal/stop-generation", headers=ADMIN).json() == "OK"
    assert host_modules.shared.stop_everything is True
