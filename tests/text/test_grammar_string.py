"""grammar_string, the web UI API's field: a GBNF grammar the output follows, in both modes (here
on the embedded model); the field an upstream host uses to constrain another instance of this
server."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.spec import error_of


def test_the_output_follows_the_grammar(client):
    for _ in range(2):
        r = client.chat.completions.create(model="x", max_tokens=8, messages=[{"role": "user", "content": "Yes?"}],
                                           extra_body={"grammar_string": 'root ::= ("yes" | "no") "!"'})
        assert r.choices[0].message.content in ("yes!", "no!")
    c = client.completions.create(model="x", prompt="Count:", max_tokens=12,
                                  extra_body={"grammar_string": 'root ::= " " [0-9] [0-9] [0-9]'})
    assert len(c.choices[0].text) == 4 and c.choices[0].text[1:].isdigit()


def test_a_grammar_that_does_not_parse_or_clashes_is_a_400(sclient, scripted):
    with pytest.raises(openai.BadRequestError) as e:
        sclient.chat.completions.create(model="x", max_tokens=8, messages=[{"role": "user", "content": "Hi"}],
                                       extra_body={"grammar_string": "root ::= (unclosed"})
    assert e.value.body["param"] == "grammar_string"
    err = error_of(httpx.post(f"{scripted.url}/chat/completions", timeout=60, json={
        "model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {"type": "json_object"}, "grammar_string": 'root ::= "x"'}), 400)
    assert err["param"] == "grammar_string" and "response_format" in err["message"]
