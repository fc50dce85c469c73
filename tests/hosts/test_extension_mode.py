"""Extension mode against a test double of the web UI's `modules` package (tests/doubles)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import openai
import pytest
from support.servers import free_port
from support.spec import assert_valid, assert_valid_stream
from support.webui import import_extension, load_extension


@pytest.fixture
def client(extension):
    return openai.OpenAI(base_url=extension.server.url, api_key="x", max_retries=0,
                         _strict_response_validation=True, timeout=30)


def test_setup_returns_at_once_and_serves_the_host_model(extension, client, host_modules):
    assert extension.server.thread.daemon
    assert extension.server.port == host_modules.shared.settings["openai_ext-port"]   # the host's setting won
    ids = [m.id for m in client.models.list().data]
    # the host's model first; the other families' models (embeddings, speech ...) after it
    assert ids[0] == host_modules.shared.model_name and host_modules.shared.model_name not in ids[1:]


def test_chat_goes_through_the_host(client, host_modules):
    tg, chat, shared = host_modules.text_generation, host_modules.chat, host_modules.shared
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", temperature=0.5, max_tokens=50, stop=["never"], seed=3,
        messages=[{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello."},
                  {"role": "system", "content": "Mid-chat rule."},
                  {"role": "user", "content": "Greet the world"}])
    assert_valid("CreateChatCompletionResponse", raw.http_response.json())
    resp = raw.parse()
    assert resp.choices[0].message.content == "Hello, world!"
    assert resp.choices[0].finish_reason == "stop"
    question, state, stops, is_chat = tg.CALLS[-1]
    # the prompt came from the host's own prompt builder and template, no system message dropped
    user_input, prompt_state = chat.CALLS[-1]
    assert user_input == "Greet the world"
    assert prompt_state["custom_system_message"] == "You are terse."
    assert prompt_state["mode"] == "instruct"
    assert question.startswith("<|im_start|>system\nYou are terse.<|im_end|>")
    assert "<|im_start|>system\nMid-chat rule.<|im_end|>" in question
    assert question.endswith("<|im_start|>assistant\n")
    # the host's settings are the base of the state, the request's parameters are mapped onto it
    assert state["truncation_length"] == shared.settings["truncation_length"] == 4096
    assert state["max_new_tokens"] == 50 and state["auto_max_new_tokens"] is False
    assert state["temperature"] == 0.5 and state["seed"] == 3
    assert state["top_k"] == shared.settings["top_k"]   # a host sampler the request did not name stays as set
    # the server applies the stop strings (the request's and the template's) and stops the host
    # through its stop event; the host, given them, would trim a partial one from its last text
    assert stops == [] and state["custom_stopping_strings"] == [] and is_chat is False
    assert state["stop_event"] is not None and state["stream"] is True
    # exact usage, from the host's tokenizer
    assert resp.usage.prompt_tokens == len(tg.encode(question)[0])
    assert resp.usage.completion_tokens == len("Hello, world!".encode())
    assert not shared.generation_lock.locked()


def test_stream_through_the_host(extension, host_modules):
    r = httpx.post(f"{extension.server.url}/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "stream": True,
                         "stream_options": {"include_usage": True}})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello, world!"
    assert chunks[-1]["usage"]["completion_tokens"] == len(text.encode())


def test_stop_string_split_across_host_tokens(client, host_modules):
    host_modules.text_generation.SCRIPT = ["The", " wor", "ld", " is", " round"]
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}], stop="orld")
    assert resp.choices[0].message.content == "The w"
    assert resp.choices[0].finish_reason == "stop"
    # the tokens returned: " wor" gave " w", "ld" is all stop string (as the logprobs' entries)
    assert resp.usage.completion_tokens == 2


def test_length_finish_from_the_host(client, host_modules):
    host_modules.text_generation.SCRIPT = ["a", "b", "c", "d", "e", "f"]
    resp = client.completions.create(model="x", prompt="p", max_tokens=3)
    assert resp.choices[0].text == "abc" and resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 3


def test_completions_use_the_raw_prompt(client, host_modules):
    client.completions.create(model="x", prompt="Once upon", max_tokens=5)
    question, state, stops, _ = host_modules.text_generation.CALLS[-1]
    assert question == "Once upon" and stops == [] and state["max_new_tokens"] == 5


def test_logprobs_are_refused_where_the_host_cannot_give_them(client, host_modules):
    host_modules.shared.args.loader = "TensorRT-LLM"   # reports none (see test_extension_logprobs.py)
    host_modules.shared.model, host_modules.shared.tokenizer = host_modules.models.new_model("TensorRT-LLM")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}], logprobs=True)
    assert e.value.body["param"] == "logprobs"


def test_host_failure_is_an_openai_500_and_the_server_keeps_serving(client, host_modules):
    host_modules.text_generation.FAIL_AFTER = 1
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "server_error"
    assert not host_modules.shared.generation_lock.locked()
    host_modules.text_generation.FAIL_AFTER = None
    ok = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}])
    assert ok.choices[0].message.content == "Hello, world!"


def test_host_failure_mid_stream_ends_with_error_event_then_done(extension, host_modules):
    host_modules.text_generation.FAIL_AFTER = 2
    r = httpx.post(f"{extension.server.url}/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "stream": True})
    assert r.text.rstrip().endswith("data: [DONE]")
    from support.spec import parse_sse
    events, done = parse_sse(r.text)
    assert done and "error" in events[-1]
    assert_valid("ErrorResponse", events[-1])
    for e in events[:-1]:
        assert_valid("CreateChatCompletionStreamResponse", e)


def test_disconnect_stops_the_host_and_frees_its_lock(extension, host_modules):
    tg, shared = host_modules.text_generation, host_modules.shared
    tg.SCRIPT = ["tok "] * 10_000
    seen = []
    original = tg.generate_reply

    def slow_reply(*a, **kw):   # paces the double like a real model, 5 ms a token
        for text in original(*a, **kw):
            seen.append(time.monotonic())
            time.sleep(0.005)
            yield text
    tg.generate_reply = slow_reply
    with httpx.stream("POST", f"{extension.server.url}/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
        lines = r.iter_lines()
        for _ in range(10):
            next(lines)
    closed = time.monotonic()
    deadline = time.monotonic() + 5
    while shared.generation_lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not shared.generation_lock.locked()
    after = [t for t in seen if t > closed]
    assert len(after) <= 3, f"{len(after)} tokens generated after the client left"
    assert len(seen) < 1000
    tg.generate_reply = original
    tg.SCRIPT = ["ok"]
    r = httpx.post(f"{extension.server.url}/completions", json={"prompt": "x"}, timeout=30)
    assert r.json()["choices"][0]["text"] == "ok"


def test_port_in_use_is_one_clear_line(host_modules, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        host_modules.shared.settings["openai_ext-port"] = taken.getsockname()[1]
        ext = load_extension(host_modules.shared)
    assert ext.server is None
    lines = [r.getMessage() for r in caplog.records if "already in use" in r.getMessage()]
    assert len(lines) == 1 and "--port" in lines[0] and "\n" not in lines[0]


def test_host_api_key_guards_the_extension(host_modules):
    host_modules.shared.args.api_key = "host-secret"
    host_modules.shared.settings["openai_ext-port"] = free_port()
    ext = load_extension(host_modules.shared)
    try:
        base = ext.server.url
        assert httpx.get(f"{base}/models").status_code == 401
        assert httpx.get(f"{base}/models", headers={"Authorization": "Bearer host-secret"}).status_code == 200
    finally:
        ext.server.stop()


@pytest.mark.slow
def test_models_stay_responsive_during_a_generation(extension, host_modules):
    tg = host_modules.text_generation
    tg.SCRIPT = ["t"] * 20
    original = tg.generate_reply
    started, release = threading.Event(), threading.Event()

    def held_reply(*a, **kw):
        # the generation stops after its first pieces until the test lets it go on: the order
        # of events is asserted, not how long anything takes
        for i, text in enumerate(original(*a, **kw)):
            if i == 2:
                started.set()
                release.wait(60)
            yield text
    tg.generate_reply = held_reply
    t = threading.Thread(target=lambda: httpx.post(f"{extension.server.url}/completions",
                                                   json={"prompt": "x", "max_tokens": 20}, timeout=60))
    t.start()
    try:
        assert started.wait(60)
        assert host_modules.shared.generation_lock.locked()
        r = httpx.get(f"{extension.server.url}/models", timeout=30)
        assert r.status_code == 200
        assert host_modules.shared.generation_lock.locked()   # answered while the generation was still running
    finally:
        release.set()
        t.join()
        tg.generate_reply = original


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_required_tool_call_through_the_host_grammar(client, host_modules):
    tg = host_modules.text_generation
    tg.SCRIPT = ["<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}', "\n</tool_call>"]
    clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    # (two tools: the model chooses the name, so it writes the whole call; with one, see below)
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                          tools=[WEATHER, clock], tool_choice="required")
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Oslo"}
    question, state, _, _ = tg.CALLS[-1]
    assert "tool-call-block" in state["grammar_string"]      # the host's grammar field carries the constraint
    assert "get_weather" in question                          # the fallback tool description reached the prompt


def test_one_forced_function_is_written_up_to_its_arguments_by_the_server(client, host_modules):
    tg = host_modules.text_generation
    tg.SCRIPT = ['{"city": ', '"Oslo"}', "}"]     # what the grammar leaves to the model
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                          tools=[WEATHER], tool_choice={"type": "function",
                                                                        "function": {"name": "get_weather"}})
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Oslo"}
    # the server's part of the call is not counted (the double's tokens are bytes)
    assert resp.usage.completion_tokens == len("".join(tg.SCRIPT))
    question, state, _, _ = tg.CALLS[-1]
    assert question.endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    assert state["grammar_string"].startswith('root ::= fn0-arguments tool-ws "}"')


def test_auto_without_a_lazy_grammar_still_validates_calls(client, host_modules):
    tg = host_modules.text_generation
    tg.SCRIPT = ["<tool_call>", '\n{"name": "get_weather", "arguments": {"town": "Oslo"}}', "\n</tool_call>"]
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}], tools=[WEATHER])
    choice = resp.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert '"town"' in choice.message.content              # not a valid call: returned as text
    assert not tg.CALLS[-1][1]["grammar_string"]            # no grammar forced a call in auto mode


def test_health_is_503_without_a_model(host_modules, make_server):
    from openai_ext.hosts.textgen import TextgenHost

    host_modules.shared.model = None
    host_modules.shared.model_name = "None"
    server = make_server(TextgenHost(host_modules))
    r = httpx.get(server.url.removesuffix("/v1") + "/health")
    assert r.status_code == 503 and r.json()["model_loaded"] is False
    ids = [m["id"] for m in httpx.get(server.url + "/models").json()["data"]]
    assert "None" not in ids and "Double-Model-1B-Instruct.Q4_K_M.gguf" not in ids
    # generation says what to do, instead of failing inside the host's tokenizer
    for path, body in (("/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/completions", {"prompt": "Hi"})):
        r = httpx.post(server.url + path, json={"model": "x", **body})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"
        assert "web UI" in r.json()["error"]["message"]


def test_abilities_follow_the_loader_the_web_ui_has_now(client, host_modules):
    """The user may load another model with another loader while the server runs."""
    ask = dict(model="x", max_tokens=5, messages=[{"role": "user", "content": "Hi"}], logit_bias={"7": -100})
    assert client.chat.completions.create(**ask).choices[0].message.content is not None   # llama.cpp applies it
    host_modules.shared.args.loader = "ExLlamav2_HF"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**ask)
    assert e.value.body["param"] == "logit_bias"
    host_modules.shared.args.loader = "llama.cpp"
    assert client.chat.completions.create(**ask).choices[0].message.content is not None


def test_prompts_rebuilt_from_tokens_keep_special_tokens(host_modules):
    """A prompt cut to fit (truncate_prompt) or sent as token ids is text again for the host:
    the chat template's special tokens must survive that."""
    from openai_ext.hosts.textgen import TextgenHost

    host = TextgenHost(host_modules)
    bos = host_modules.text_generation.BOS
    assert host.detokenize([bos, *b"Hi"]) == "<s>Hi"


# --- settings inside the web UI ---------------------------------------------------------------

@pytest.mark.parametrize("content, problem", [("{oops", "not valid JSON"), ("[1, 2]", "JSON object"),
                                              ('{"port": "five thousand"}', "port")])
def test_a_bad_settings_json_is_one_logged_error_and_the_web_ui_runs_on(host_modules, monkeypatch, tmp_path,
                                                                          caplog, content, problem):
    from openai_ext.core import config

    bad = tmp_path / "settings.json"
    bad.write_text(content)
    monkeypatch.setattr(config, "SETTINGS_FILE", bad)
    ext = load_extension(host_modules.shared)   # neither the import nor setup() may end the web UI
    assert ext.server is None
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert problem in errors[0] and "not started" in errors[0] and "\n" not in errors[0]
    assert "openai_ext-<setting>" in errors[0]   # where the web UI's own settings name it


def test_a_bad_override_from_the_web_ui_is_one_logged_error(host_modules, caplog):
    host_modules.shared.settings["openai_ext-port"] = "not a port"
    ext = load_extension(host_modules.shared)
    assert ext.server is None
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "port" in errors[0] and "\n" not in errors[0]


def test_a_missing_certificate_frees_the_port_it_had_bound(host_modules, caplog, tmp_path):
    port = free_port()
    shared = host_modules.shared
    shared.settings.update({"openai_ext-port": port, "openai_ext-cert_path": str(tmp_path / "no-cert.pem"),
                            "openai_ext-key_path": str(tmp_path / "no-key.pem")})
    ext = load_extension(shared)
    assert ext.server is None
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "no-cert.pem" in errors[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))   # the web UI runs on: the port must not stay taken


def test_every_setting_is_a_param_the_web_ui_can_override(host_modules):
    """The web UI overrides only the keys params already has: each setting must be one."""
    from openai_ext.core.config import Settings

    params = import_extension().params
    missing = set(Settings.model_fields) - set(params)
    assert not missing, f"settings the web UI's settings.yaml could not set: {sorted(missing)}"
    shared = host_modules.shared
    shared.settings.update({"openai_ext-port": free_port(), "openai_ext-max_n": 2, "openai_ext-allowed_hosts": ["api.lan"]})
    ext = load_extension(shared)
    try:
        base = ext.server.url
        r = httpx.post(f"{base}/completions", json={"prompt": "x", "max_tokens": 2, "n": 3}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "2" in r.json()["error"]["message"]
        ok = httpx.post(f"{base}/completions", json={"prompt": "x", "max_tokens": 2, "n": 2}, timeout=30)
        assert ok.status_code == 200
        assert httpx.get(f"{base}/models", headers={"Host": "api.lan"}).status_code == 200
    finally:
        ext.server.stop()


# --- what the host's loader applies -----------------------------------------------------------

def test_samplers_the_loader_does_not_apply_are_refused_by_name(client, host_modules):
    """llama.cpp applies top_k but not tfs (modules.loaders.loaders_samplers); Transformers both."""
    ask = dict(model="x", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    client.chat.completions.create(**ask, extra_body={"top_k": 7})
    assert host_modules.text_generation.CALLS[-1][1]["top_k"] == 7
    for name, value in (("tfs", 0.9), ("top_a", 0.2), ("skip_special_tokens", False)):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**ask, extra_body={name: value})
        assert e.value.body["param"] == name and name in e.value.body["message"]
    host_modules.shared.args.loader = "Transformers"
    client.chat.completions.create(**ask, extra_body={"tfs": 0.9})
    assert host_modules.text_generation.CALLS[-1][1]["tfs"] == 0.9


# --- finish reason and usage --------------------------------------------------------------------

def test_length_at_exactly_max_tokens_though_the_text_ends_like_a_stop_string(client, extension, host_modules):
    """The host trims the start of a stop string off the end of its last text ("ab<" becomes
    "ab" for the template's "<|im_end|>"); counted from that text, a reply cut at max_tokens
    looked stopped. The server applies the stops itself, so the host's text is whole."""
    tg = host_modules.text_generation
    tg.SCRIPT = ["a", "b", "<", "|im_end|>"]
    state = {**host_modules.shared.settings, "max_new_tokens": 3, "auto_max_new_tokens": False}
    assert list(tg.generate_reply("q", state, stopping_strings=["<|im_end|>"]))[-1] == "ab"   # the host trims
    ask = dict(model="x", max_tokens=3, messages=[{"role": "user", "content": "x"}])
    resp = client.chat.completions.create(**ask)
    choice = resp.choices[0]
    assert (choice.message.content, choice.finish_reason, resp.usage.completion_tokens) == ("ab<", "length", 3)
    r = httpx.post(f"{extension.server.url}/chat/completions", timeout=30,
                   json={**ask, "stream": True, "stream_options": {"include_usage": True}})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "ab<"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    # one token more and the stop string is complete: a stop, and nothing of it is shown
    resp = client.chat.completions.create(**{**ask, "max_tokens": 4})
    assert (resp.choices[0].message.content, resp.choices[0].finish_reason) == ("ab", "stop")


def test_a_reply_that_ends_before_max_tokens_is_a_stop(client, host_modules):
    host_modules.text_generation.SCRIPT = ["a", "b"]
    resp = client.completions.create(model="x", prompt="p", max_tokens=3)
    assert (resp.choices[0].text, resp.choices[0].finish_reason, resp.usage.completion_tokens) == ("ab", "stop", 2)


# --- partial characters ---------------------------------------------------------------------------

def test_a_character_split_across_tokens_is_sent_whole(client, extension, host_modules):
    """The double decodes its whole output at each step, as some loaders do: between the two
    tokens of the emoji's bytes, its text ends in U+FFFD."""
    tg = host_modules.text_generation
    tg.SCRIPT = ["Hi ", "\U0001F600".encode()[:2], "\U0001F600".encode()[2:], "!"]
    state = {**host_modules.shared.settings, "auto_max_new_tokens": False}
    assert "Hi \ufffd" in list(tg.generate_reply("q", state))   # what the host yields
    r = httpx.post(f"{extension.server.url}/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "stream": True})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert "".join(pieces) == "Hi \U0001F600!" and not any("\ufffd" in p for p in pieces)
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}])
    assert resp.choices[0].message.content == "Hi \U0001F600!"


def test_a_host_that_changes_its_text_is_followed_on(extension, host_modules):
    """Text already sent cannot be unsent; when the host goes on from a changed text the rest
    still arrives. A change in its very last yield (output hooks) is not followed."""
    tg = host_modules.text_generation
    yields = {"resync": ["", "a\ufffdb", "a\U0001F600b", "a\U0001F600bc", "a\U0001F600bc"],
              "hooks": ["", "Hel", "Hello", "Hello", "HELLO (translated)"]}
    script = []

    def replies(question, state, stopping_strings=None, is_chat=False, **kw):
        yield from script
    tg.generate_reply = replies
    for case, expected in (("resync", "a\ufffdbc"), ("hooks", "Hello")):
        script[:] = yields[case]
        r = httpx.post(f"{extension.server.url}/completions", json={"prompt": "x", "max_tokens": 50}, timeout=30)
        assert r.json()["choices"][0]["text"] == expected, case


# --- the web UI's idle timeout --------------------------------------------------------------------

def test_a_model_unloaded_for_idleness_is_loaded_again_off_the_event_loop(client, extension, host_modules):
    """With --idle-timeout the web UI unloads an idle model but keeps its name, and loads it
    again when it is next used."""
    shared, models = host_modules.shared, host_modules.models
    shared.args.idle_timeout = 10
    models.unload_model(keep_model_name=True)
    assert shared.model is None
    health = httpx.get(extension.server.url.removesuffix("/v1") + "/health")
    assert health.status_code == 200 and health.json()["model_loaded"] is True
    assert [m.id for m in client.models.list().data][0] == shared.model_name
    threads = []
    original = models.load_model_if_idle_unloaded

    def spy():
        threads.append(threading.current_thread().name)
        original()
    models.load_model_if_idle_unloaded = spy
    resp = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}])
    assert resp.choices[0].message.content == "Hello, world!"
    assert shared.model is not None and models.LOADS == [shared.model_name]
    # loading takes seconds: it ran on a worker thread, never on the server's event loop
    assert threads and extension.server.thread.name not in threads
    # a model unloaded for good (its name dropped) is not loaded again
    models.unload_model()
    r = httpx.post(f"{extension.server.url}/completions", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"


def test_the_web_uis_exit_ends_open_streams_with_an_error_event_and_frees_the_lock(host_modules, monkeypatch):
    """The server thread is a daemon: at the web UI's exit it would die mid-stream. The exit hook
    the extension registers shuts it down as SIGTERM does."""
    import threading

    hooks = []
    monkeypatch.setattr(threading, "_register_atexit", lambda fn, *a, **kw: hooks.append(fn))
    tg, shared = host_modules.text_generation, host_modules.shared
    tg.SCRIPT = ["tok "] * 10_000
    original = tg.generate_reply

    def paced(*a, **kw):   # 5 ms a token, like a small model
        for text in original(*a, **kw):
            time.sleep(0.005)
            yield text
    monkeypatch.setattr(tg, "generate_reply", paced)
    shared.settings["openai_ext-port"] = free_port()
    ext = load_extension(shared)
    assert hooks
    from support.spec import parse_sse
    with httpx.stream("POST", f"{ext.server.url}/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
        lines = r.iter_lines()
        raw = [next(lines) for _ in range(6)]
        for hook in hooks:   # what the interpreter does at exit
            hook()
        raw += list(lines)
    events, done = parse_sse("\n".join(raw) + "\n")
    assert done and events[-1]["error"]["code"] == "server_shutting_down"
    assert not shared.generation_lock.locked()


def test_a_prompt_that_cannot_fit_names_the_web_uis_context_length_first(client, host_modules):
    long = "word " * (host_modules.shared.settings["truncation_length"] + 50)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", max_tokens=5, messages=[{"role": "user", "content": long}])
    message = e.value.body["message"]
    assert e.value.body["code"] == "context_length_exceeded" and "--n-ctx" not in message
    assert "ctx-size" in message and "longer context" in message
    assert message.index("ctx-size") < message.index("truncate_prompt"), message
