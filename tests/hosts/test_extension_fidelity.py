"""What the double does as the real web UI does, where the extension depends on it: yields
less than 1 ms apart dropped, a model's metadata applied when it loads, stop strings from the
template, failures only logged (see also test_extension_logprobs.py and
test_extension_parallel.py)."""

from __future__ import annotations

import httpx
from support.spec import assert_valid_stream

OTHER = "Other-Model-3B-Instruct.Q5_K_M.gguf"


def test_a_fast_model_whose_yields_the_host_drops(extension, host_modules):
    """At more than 1000 tokens a second the host yields only some texts: the reply and its
    usage are still whole."""
    tg = host_modules.text_generation
    tg.TOKEN_SECONDS = 0
    tg.SCRIPT = [f" w{i}" for i in range(300)]
    seen = []
    original = tg.generate_reply

    def spy(*a, **kw):
        for text in original(*a, **kw):
            seen.append(text)
            yield text
    tg.generate_reply = spy
    r = httpx.post(f"{extension.server.url}/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 300,
                         "stream_options": {"include_usage": True}})
    chunks = assert_valid_stream("CreateChatCompletionStreamResponse", r.text)
    assert len(seen) < 300   # the host did drop yields
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == \
        "".join(tg.SCRIPT)
    assert chunks[-1]["usage"]["completion_tokens"] == 300
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_loading_a_model_applies_its_context_and_template(extension, host_modules):
    """The host's load_model takes the model's context (ctx_size) and instruction template from
    its metadata; the API follows both, and the stop strings the new template implies."""
    base = extension.server.url
    assert httpx.post(f"{base}/internal/model/load", json={"model_name": OTHER}, timeout=30).status_code == 200
    assert host_modules.shared.settings["truncation_length"] == 8192
    long_prompt = "x" * 6000   # over the first model's 4096, within this one's 8192
    r = httpx.post(f"{base}/completions", json={"prompt": long_prompt, "max_tokens": 1}, timeout=30)
    assert r.status_code == 200, r.text
    host_modules.text_generation.SCRIPT = ["Sure.", "\n\n### Instruction:", " more"]
    r = httpx.post(f"{base}/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}, timeout=30)
    assert host_modules.text_generation.CALLS[-1][0] == "### Instruction:\nHi\n\n### Response:\n"
    assert r.json()["choices"][0]["message"]["content"] == "Sure."   # stopped by the template's own stop


def test_a_failure_the_host_only_logs_is_an_error_not_a_cut_reply(extension, host_modules):
    tg = host_modules.text_generation
    tg.FAIL_AFTER = 2
    r = httpx.post(f"{extension.server.url}/completions", json={"prompt": "x", "max_tokens": 9}, timeout=30)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert any("Failed to generate reply" in line for line in host_modules.logging_colors.logger.buffer)
    assert not host_modules.shared.generation_lock.locked()
