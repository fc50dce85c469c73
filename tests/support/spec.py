"""Validation of response bodies and stream chunks against OpenAI's OpenAPI spec (test data).

The spec is OpenAPI 3.1 (JSON Schema 2020-12) but still marks some fields with the 3.0 keyword
``nullable: true``; those nodes are rewritten to also accept null before validating.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from support import open_responses

SPEC_PATH = Path(__file__).resolve().parent.parent / "data" / "openai-openapi" / "openapi.json"
_ROOT = "urn:openai-spec"


def _allow_null(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _allow_null(v) for k, v in node.items()}
        if node.pop("nullable", False) is True:
            return {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_allow_null(v) for v in node]
    return node


@functools.cache
def _spec() -> dict[str, Any]:
    spec = _allow_null(json.loads(SPEC_PATH.read_text()))
    schemas = spec["components"]["schemas"]
    # Legacy completions stream chunks share CreateCompletionResponse's shape, but carry a null
    # finish_reason until the last chunk, which the spec's enum does not allow.
    stream = copy.deepcopy(schemas["CreateCompletionResponse"])
    stream["properties"]["choices"]["items"]["properties"]["finish_reason"] = {
        "anyOf": [stream["properties"]["choices"]["items"]["properties"]["finish_reason"], {"type": "null"}]}
    schemas["CreateCompletionStreamResponse"] = stream
    # Open Responses requires usage in every Response object, null until the end, as the example of
    # response.created in OpenAI's spec itself has it; OpenAI's schema only leaves the key out.
    props = schemas["Response"]["allOf"][2]["properties"]
    props["usage"] = {"anyOf": [props["usage"], {"type": "null"}]}
    # A defect: the MCP approval response's schemas require a "request_id" they do not define; the
    # official SDK's McpApprovalResponse has no such field (it answers approval_request_id).
    for name in ("MCPApprovalResponse", "MCPApprovalResponseResource"):
        schemas[name]["required"] = [r for r in schemas[name]["required"] if r != "request_id"]
    # CompoundFilter nests itself with a 2019-09 "$recursiveRef": "#", which a 2020-12 validator reads
    # as the whole document; it means the CompoundFilter schema (its "$recursiveAnchor").
    compound = schemas["CompoundFilter"]["properties"]["filters"]["items"]
    compound["oneOf"] = [{"$ref": "#/components/schemas/CompoundFilter"} if o == {"$recursiveRef": "#"} else o
                         for o in compound["oneOf"]]
    return spec


@functools.cache
def _validator(name: str) -> Draft202012Validator:
    spec = _spec()
    registry = Registry().with_resource(_ROOT, Resource.from_contents(spec, default_specification=DRAFT202012))
    schema = {"$ref": f"{_ROOT}#/components/schemas/{name}"}
    return Draft202012Validator(schema, registry=registry)


def errors(name: str, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in _validator(name).iter_errors(doc)]


def assert_valid(name: str, doc: Any) -> None:
    """Valid against OpenAI's spec and, for the Responses API's bodies and events, against Open Responses too."""
    errs = errors(name, doc)
    assert not errs, f"{name} does not validate:\n" + "\n".join(errs[:10]) + f"\n{json.dumps(doc)[:2000]}"
    if name in ("Response", "CompactResource"):
        open_responses.assert_valid({"Response": "ResponseResource"}.get(name, name), doc)
    elif name == "ResponseStreamEvent":
        open_responses.assert_valid_event(doc)
    elif name == "ResponsesServerEvent":   # the Responses WebSocket: stream events, and its own error envelope
        if doc.get("type") == "error":
            open_responses.assert_valid("WebSocketErrorEvent", doc)
        else:
            open_responses.assert_valid_event(doc)


def parse_sse(raw: str) -> tuple[list[Any], bool]:
    """Returns the JSON payloads of an SSE body and whether it ended with [DONE]."""
    events, done = [], False
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
        if not data:
            continue
        payload = "\n".join(data)
        assert not done, "data after [DONE]"
        if payload == "[DONE]":
            done = True
        else:
            events.append(json.loads(payload))
    return events, done


def assert_valid_stream(name: str, raw: str) -> list[Any]:
    """Every chunk validates, all share id/created/model, and the stream ends with [DONE]."""
    chunks, done = parse_sse(raw)
    assert done, "stream did not end with data: [DONE]"
    assert chunks, "stream carried no chunks"
    for c in chunks:
        assert_valid(name, c)
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1, "chunks disagree on id/created/model"
    return chunks


def error_of(response, status: int | None = None) -> dict:
    """The error object of an error response (of ``status``, when given): valid against the
    spec's ErrorResponse, and without FastAPI's own ``detail``."""
    if status is not None:
        assert response.status_code == status, response.text
    body = response.json()
    assert_valid("ErrorResponse", body)
    assert "detail" not in body
    return body["error"]
