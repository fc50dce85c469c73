"""Bodies that are not Unicode text are the client's mistake: a 400 naming the field, on every
route, before any engine or tokenizer sees them."""

from __future__ import annotations

import httpx
import pytest

from openai_ext.core.bodies import check_json_text
from openai_ext.core.errors import InvalidRequestError

ROUTES = [
    ("/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "SURROGATE"}]},
     "messages[0].content"),
    ("/completions", {"model": "x", "prompt": "SURROGATE"}, "prompt"),
    ("/embeddings", {"model": "text-embedding-3-small", "input": ["fine", "bad SURROGATE"]}, "input[1]"),
    ("/moderations", {"input": "SURROGATE"}, "input"),
    ("/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "SURROGATE"}, "input"),
    ("/internal/encode", {"text": "SURROGATE"}, "text"),
]


@pytest.mark.parametrize("path,body,param", ROUTES, ids=[r[0] for r in ROUTES])
@pytest.mark.parametrize("form", ["escaped", "raw bytes"])
def test_a_lone_surrogate_is_a_400_naming_the_field(scripted, path, body, param, form):
    import json
    text = json.dumps(body)
    if form == "escaped":
        data = text.replace("SURROGATE", "\\ud800").encode()
    else:
        data = text.encode().replace(b"SURROGATE", b"\xed\xa0\x80")
    r = httpx.post(f"{scripted.url}{path}", content=data, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    if form == "escaped":
        assert err["param"] == param and "surrogate" in err["message"]
    else:
        # Python's JSON reader would turn these bytes into the same lone surrogate
        assert err["param"] == param or "UTF-8" in err["message"]


def test_pairs_and_escaped_backslashes_pass():
    check_json_text(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800", "c": "plain"}')
    check_json_text("{\"a\": \"\N{GRINNING FACE}\"}".encode())


def test_a_lone_low_half_and_a_key_are_found():
    with pytest.raises(InvalidRequestError) as e:
        check_json_text(b'{"a": ["x", {"b": "\\udc00"}]}')
    assert e.value.param == "a[1].b"
    with pytest.raises(InvalidRequestError) as e:
        check_json_text(b'{"\\ud800": 1}')
    assert e.value.param == "<key>"


def test_a_deep_body_is_walked_without_recursion():
    deep = b'{"a":' + b"[" * 900 + b'"\\ud800"' + b"]" * 900 + b"}"
    with pytest.raises(InvalidRequestError) as e:
        check_json_text(deep)
    assert e.value.param == "a" + "[0]" * 900


def test_a_body_nested_too_deep_for_the_json_reader_is_a_400(scripted):
    deep = b'{"model": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{scripted.url}/chat/completions", content=deep, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
