"""A batch's input file read into requests, and each request's result as a line of its output or
error file, in OpenAI's batch formats (request input, request output)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

# The endpoints a batch may run: those this server serves that OpenAI's batches take.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/moderations")
MAX_LINES = 50000
MAX_ERRORS = 100   # errors reported of a file that fails validation


@dataclass(frozen=True)
class Line:
    number: int          # from 1, as the file's lines
    custom_id: str
    body: dict[str, Any]


class Invalid(Exception):
    """The file cannot run: ``errors`` are BatchError objects (code, message, param, line)."""

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__(errors[0]["message"] if errors else "invalid")
        self.errors = errors


def error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def parse(content: bytes, endpoint: str) -> list[Line]:
    """The requests of a batch's input file, each checked as OpenAI checks them before a batch
    runs: a JSON object per line with a unique custom_id, method POST, the batch's url and a body.
    Any mistake fails the whole batch (Invalid), naming the lines."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid([error("invalid_file", "The input file is not UTF-8 text (JSONL).")]) from None
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    raw_lines = [(n, raw) for n, raw in enumerate(text.splitlines(), 1) if raw.strip()]
    if not raw_lines:
        raise Invalid([error("empty_file", "The input file holds no requests: one JSON object per line.")])
    if len(raw_lines) > MAX_LINES:
        raise Invalid([error("too_many_requests", f"The input file holds {len(raw_lines)} requests; a batch takes "
                                                  f"{MAX_LINES} at most. Split it into several batches.")])
    for n, raw in raw_lines:
        problem = _check(n, raw, endpoint, seen)
        if isinstance(problem, Line):
            lines.append(problem)
            seen.add(problem.custom_id)
        else:
            errors.append(problem)
            if len(errors) >= MAX_ERRORS:
                break
    if errors:
        raise Invalid(errors)
    return lines


def _check(n: int, raw: str, endpoint: str, seen: set[str]) -> Line | dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return error("invalid_json_line", f"Line {n} is not valid JSON.", n)
    if not isinstance(doc, dict):
        return error("invalid_request", f"Line {n} must be a JSON object.", n)
    unknown = sorted(set(doc) - {"custom_id", "method", "url", "body"})
    if unknown:
        return error("invalid_request", f"Line {n} has an unknown field '{unknown[0]}'; a line takes custom_id, "
                                        "method, url and body.", n, unknown[0])
    cid = doc.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return error("missing_required_parameter", f"Line {n} needs a custom_id (a string).", n, "custom_id")
    if cid in seen:
        return error("duplicate_custom_id", f"Line {n}'s custom_id {cid!r} is used by an earlier line; each "
                                            "must be unique.", n, "custom_id")
    if doc.get("method") != "POST":
        return error("invalid_method", f"Line {n}'s method must be POST.", n, "method")
    if doc.get("url") != endpoint:
        return error("mismatched_url", f"Line {n}'s url is {doc.get('url')!r}, but the batch's endpoint is "
                                       f"{endpoint}; every line must use the batch's endpoint.", n, "url")
    body = doc.get("body")
    if not isinstance(body, dict):
        return error("invalid_request", f"Line {n}'s body must be a JSON object (the request).", n, "body")
    return Line(n, cid, body)


def output(line: Line, status: int, body: Any) -> dict[str, Any]:
    """The request's answer, as a line of the output (2xx) or error file."""
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex[:24]}", "body": body},
            "error": None}


def failed(line: Line, code: str, message: str) -> dict[str, Any]:
    """A request that was not run (the batch expired or was cancelled first, or it cannot run in a
    batch), as a line of the error file."""
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": line.custom_id, "response": None,
            "error": {"code": code, "message": message}}


def usage(bodies: list[Any]) -> dict[str, Any]:
    """The batch's token usage: the sum of its answers' usage (chat and completions count prompt and
    completion tokens, Responses input and output tokens, embeddings prompt tokens)."""
    tin = tout = cached = reasoning = 0
    for body in bodies:
        u = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(u, dict):
            continue
        tin += int(u.get("input_tokens", u.get("prompt_tokens", 0)) or 0)
        tout += int(u.get("output_tokens", u.get("completion_tokens", 0)) or 0)
        details = u.get("input_tokens_details") or u.get("prompt_tokens_details") or {}
        cached += int(details.get("cached_tokens", 0) or 0)
        out_details = u.get("output_tokens_details") or u.get("completion_tokens_details") or {}
        reasoning += int(out_details.get("reasoning_tokens", 0) or 0)
    return {"input_tokens": tin, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": tout,
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": tin + tout}
