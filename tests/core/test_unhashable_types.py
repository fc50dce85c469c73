"""A "type" (or role) that is a list or an object where a string belongs is a 400 naming it, never
a 500: such values cannot be looked up in the sets and tables the routes keep of known names.
(Found by the fuzzer: POST /v1/messages with a content block of type [] crashed the request.)"""

from __future__ import annotations

import httpx
import pytest
from support.spec import error_of


@pytest.mark.parametrize("path, body", [
    ("/messages", {"model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": []}]}]}),
    ("/messages", {"model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
                   "context_management": {"edits": [{"type": {}}]}}),
    ("/messages", {"model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
                   "output_config": {"format": {"type": ["json_schema"]}}}),
    ("/responses", {"model": "x", "input": [{"type": ["message"], "role": "user", "content": "Hi"}]}),
    ("/responses", {"model": "x", "input": "Hi", "tools": [{"type": ["function"]}]}),
    ("/responses", {"model": "x", "input": "Hi", "tools": [{"type": "function", "name": "f"}],
                    "tool_choice": {"type": ["web_search"]}}),
    ("/responses", {"model": "x", "input": "Hi", "tools": [{"type": "function", "name": "f"}],
                    "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": []}]}}),
])
def test_a_non_string_type_is_a_400(scripted, path, body):
    r = httpx.post(f"{scripted.url}{path}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    if path == "/responses":
        error_of(r, 400)
    else:
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
