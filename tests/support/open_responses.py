"""Validation against the Open Responses specification (release 2026-04-24, test data), beside OpenAI's.

Open Responses is a subset of OpenAI's Responses API with a few stricter rules. Where this server speaks a part of
OpenAI's API that Open Responses does not define (an OpenAI item, tool or event type), the spec's own extension
rule applies: such a part must be one that OpenAI's spec defines (validated there), and everything around it must
still be valid here. Those parts are named in ``OPENAI_ONLY``; nothing else is let through.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(__file__).resolve().parent.parent / "data" / "open-responses" / "openapi.json"
_ROOT = "urn:open-responses-spec"

# What OpenAI's API has and Open Responses does not: validated against OpenAI's spec only.
OPENAI_ONLY = {
    "ItemField": {"file_search_call", "web_search_call", "computer_call", "computer_call_output",
                  "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output",
                  "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "mcp_call",
                  "custom_tool_call", "custom_tool_call_output"},
    "Tool": {"file_search", "web_search", "web_search_preview", "computer_use_preview", "image_generation",
             "code_interpreter", "local_shell", "mcp", "custom", "namespace"},
    # OpenAI's ToolChoiceMCP ({type: mcp, server_label, name}) and ToolChoiceTypes ({type: file_search})
    # stand where a function choice does
    "FunctionToolChoice": {"mcp", "file_search"},
    # file_search's citations (OpenAI's FileCitationBody) beside Open Responses' url_citation
    "Annotation": {"file_citation"},
}


# Events OpenAI names otherwise: this server sends OpenAI's names (its SDKs, Codex and the Agents SDK read
# them); the event is validated against Open Responses' schema under its Open Responses name.
RENAMED = {"response.reasoning_text.delta": "response.reasoning.delta",
           "response.reasoning_text.done": "response.reasoning.done"}


@functools.cache
def spec() -> dict[str, Any]:
    doc = json.loads(SPEC_PATH.read_text())
    schemas = doc["components"]["schemas"]
    for union, kinds in OPENAI_ONLY.items():
        schemas[union] = {"anyOf": [schemas[union], {
            "type": "object", "required": ["type"], "properties": {"type": {"enum": sorted(kinds)}}}]}
    # A defect of the 2026-04-24 document: a json_schema format's schema is typed null (its TypeSpec source
    # says an object); read as the object it is.
    schemas["JsonSchemaResponseFormat"]["properties"]["schema"] = {"anyOf": [{"type": "object"}, {"type": "null"}]}
    return doc


@functools.cache
def _validator(name: str) -> Draft202012Validator:
    registry = Registry().with_resource(_ROOT, Resource.from_contents(spec(), default_specification=DRAFT202012))
    return Draft202012Validator({"$ref": f"{_ROOT}#/components/schemas/{name}"}, registry=registry)


@functools.cache
def stream_event_schemas() -> dict[str, str]:
    """Event type -> the name of the schema Open Responses gives it, from the stream's union."""
    doc = spec()
    union = doc["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    names = [ref["$ref"].rsplit("/", 1)[1] for ref in union["oneOf"]]
    return {doc["components"]["schemas"][n]["properties"]["type"]["enum"][0]: n for n in names}


# OpenAI's stream events for the OpenAI-only parts above (and their own deltas): validated against OpenAI's spec.
OPENAI_ONLY_EVENTS = ("response.file_search_call.", "response.web_search_call.", "response.image_generation_call.",
                      "response.code_interpreter_call", "response.mcp_", "response.custom_tool_call_input.")


def errors(name: str, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in _validator(name).iter_errors(doc)]


def assert_valid(name: str, doc: Any) -> None:
    errs = errors(name, doc)
    assert not errs, (f"{name} does not validate against Open Responses:\n" + "\n".join(errs[:10])
                      + f"\n{json.dumps(doc)[:2000]}")


def assert_valid_event(event: dict[str, Any]) -> None:
    """A stream (or WebSocket) event validates against the schema Open Responses gives its type."""
    kind = event["type"]
    if kind in RENAMED:
        event = {**event, "type": RENAMED[kind]}
        kind = event["type"]
    name = stream_event_schemas().get(kind)
    if name is None:
        assert kind.startswith(OPENAI_ONLY_EVENTS), f"{kind} is neither an Open Responses nor a known OpenAI event"
        assert isinstance(event.get("sequence_number"), int)
        return
    assert_valid(name, event)
