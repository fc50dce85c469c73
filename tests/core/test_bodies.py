"""Bodies that are not Unicode text, that nest too deep or that hold numbers JSON has not (NaN,
Infinity, 1e999) are the client's mistake: a 400 naming the field, on every route, before any
engine or tokenizer sees them. The WebSocket frames' side is in the Realtime and Responses
socket tests; the rules are the same helper's (core/bodies.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from support.spec import error_of

from openai_ext.core import bodies
from openai_ext.core.bodies import MAX_DEPTH, check_json_text, load_json
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
    deep = b'{"a":' + b"[" * (MAX_DEPTH - 1) + b'"\\ud800"' + b"]" * (MAX_DEPTH - 1) + b"}"
    with pytest.raises(InvalidRequestError) as e:
        check_json_text(deep)
    assert e.value.param == "a" + "[0]" * (MAX_DEPTH - 1)


def test_a_body_nested_too_deep_for_the_json_reader_is_a_400(scripted):
    deep = b'{"model": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{scripted.url}/chat/completions", content=deep, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


# --- nesting -----------------------------------------------------------------------------------
def nested(levels: int, inner: bytes = b"1") -> bytes:
    return b'{"a":' + b"[" * (levels - 1) + inner + b"]" * (levels - 1) + b"}"


def test_nesting_is_limited_the_same_way_wherever_it_is_read():
    for check in (check_json_text, load_json):
        check(nested(MAX_DEPTH))
        with pytest.raises(InvalidRequestError) as e:
            check(nested(MAX_DEPTH + 1))
        assert e.value.code == "invalid_json" and str(MAX_DEPTH) in e.value.message


def test_brackets_inside_strings_do_not_count_as_nesting():
    deep_text = "[" * 5000 + "{" * 5000
    check_json_text(json.dumps({"a": deep_text, "b": 'say \\"[[[[' + deep_text, "c": "\\" + "[" * 600}).encode())
    # an escaped backslash ends the string's escape: the brackets after its closing quote count
    with pytest.raises(InvalidRequestError):
        check_json_text(b'{"a": "x\\\\", "b": ' + b"[" * 600 + b"]" * 600 + b"}")
    # many shallow objects side by side are not deep
    check_json_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}]}] * 5000}).encode())
    # the same with many strings (cut with arrays rather than split)
    many = json.dumps({"input": ['x\\"[{', "[[", "\\"] * 40_000}).encode()
    check_json_text(many)
    with pytest.raises(InvalidRequestError):
        check_json_text(many[:-1] + b', "deep": ' + b"[" * 600 + b"]" * 600 + b"}")


def test_a_body_nested_past_the_limit_is_a_400_naming_it(scripted):
    deep = b'{"model": "x", "messages": [{"role": "user", "content": "Hi"}], "metadata": ' + \
        b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
    r = httpx.post(f"{scripted.url}/chat/completions", content=deep, headers={"content-type": "application/json"},
                   timeout=30)
    err = error_of(r, 400)
    assert err["code"] == "invalid_json" and str(MAX_DEPTH) in err["message"]


# --- numbers that are not finite ---------------------------------------------------------------------
CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
NOT_FINITE = [
    ("/chat/completions", {**CHAT, "min_p": "X"}, "min_p"),
    ("/chat/completions", {**CHAT, "repetition_penalty": "X"}, "repetition_penalty"),
    ("/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "string", "enum": ["X"]}}}}, "response_format.json_schema.schema.enum[0]"),
    ("/completions", {"model": "x", "prompt": "Hi", "temperature": "X"}, "temperature"),
    ("/embeddings", {"model": "text-embedding-3-small", "input": "Hi", "dimensions": "X"}, "dimensions"),
    ("/responses", {"model": "x", "input": "Hi", "top_p": "X"}, "top_p"),
    ("/messages", {"model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}],
                   "temperature": "X"}, "temperature"),
    # a route that takes uploads, sent OpenAI's JSON form
    ("/images/edits", {"model": "gpt-image-1", "prompt": "A cat", "n": "X",
                       "images": [{"image_url": "data:image/png;base64,AAAA"}]}, "n"),
]
# the last two overflow through a long mantissa with a small exponent
LITERALS = ["NaN", "Infinity", "-Infinity", "1e999", "-1.5E+400", "1" * 400 + ".0", "1" + "0" * 300 + "e10",
            "1" + "0" * 250 + ".5e60"]


@pytest.mark.parametrize("path,body,param", NOT_FINITE, ids=[f"{r[0]} {r[2]}" for r in NOT_FINITE])
@pytest.mark.parametrize("literal", LITERALS)
def test_a_number_that_is_not_finite_is_a_400_naming_the_field(scripted, path, body, param, literal):
    data = json.dumps(body).replace('"X"', literal).encode()
    r = httpx.post(f"{scripted.url}{path}", content=data, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    if path == "/messages":   # Anthropic's error object: the path is in the message
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and param in err["message"], err
    else:
        err = error_of(r, 400)
        assert err["param"] == param and err["code"] == "invalid_value", err
    assert "finite number" in err["message"] and (literal[:20] in err["message"])


def test_finite_numbers_and_text_that_only_looks_like_one_pass(sclient):
    check_json_text(b'{"a": 1e300, "b": -1.7976931348623157e308, "c": 1e-999, "d": ' + b"1" * 400 + b"}")
    assert load_json('{"a": 1e300, "s": "NaN or Infinity, 1e999"}') == {"a": 1e300, "s": "NaN or Infinity, 1e999"}
    reply = sclient.chat.completions.create(model="x", max_tokens=5, messages=[
        {"role": "user", "content": "Is NaN a number? Infinity? 1e999? [[[["}], temperature=1e-300)
    assert reply.choices[0].message.content


def test_ordinary_text_is_not_parsed_again(monkeypatch):
    """The hooks' second parse happens only when the bytes outside strings could hold a number
    that is not finite; text inside strings never causes it."""
    parses = []
    real = json.loads
    monkeypatch.setattr(bodies.json, "loads", lambda *a, **kw: parses.append(kw) or real(*a, **kw))
    body = json.dumps({"model": "x", "temperature": 0.7, "logit_bias": {"50256": -100}, "messages": [
        {"role": "user", "content": "NaN Infinity 1e999 " + "9" * 400}] * 50}).encode()
    check_json_text(body)
    assert parses == []
    with pytest.raises(InvalidRequestError):
        check_json_text(body.replace(b"0.7", b"NaN"))
    assert len(parses) == 1 and "parse_constant" in parses[0]
