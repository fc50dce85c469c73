"""Builders of the response objects, shaped exactly as OpenAI's spec requires.

Every key the spec marks required is written here (``refusal``, ``logprobs``, ``usage`` ...),
in one place per object, so no code path can forget one.
"""

from __future__ import annotations

from typing import Any

from .assembly import TokenLogprob, usage
from .generation import Job


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for t, lp, b in e.top]}
                        for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[TokenLogprob | None], offset: int = 0) -> dict[str, Any]:
    """The legacy completions shape; ``None`` entries are tokens without a score (the first
    prompt token with echo). ``offset`` is where the first token starts in the choice text."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    pos = offset
    for e in entries:
        if e is None:
            continue
        out["tokens"].append(e.token)
        out["token_logprobs"].append(e.logprob)
        out["top_logprobs"].append({t: lp for t, lp, _ in e.top} if e.top else None)
        out["text_offset"].append(pos)
        pos += len(e.token)
    return out


def with_first_unscored(first: str, rest: dict[str, Any]) -> dict[str, Any]:
    """Prepends the unscored first prompt token that OpenAI reports with a null log-probability.
    ``rest`` already carries offsets counted from the start of the text."""
    return {"tokens": [first, *rest["tokens"]], "token_logprobs": [None, *rest["token_logprobs"]],
            "top_logprobs": [None, *rest["top_logprobs"]],
            "text_offset": [0, *rest["text_offset"]]}


def chat_completion(job: Job, fingerprint: str, choices: list[dict[str, Any]], prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    return {"id": job.id, "object": "chat.completion", "created": job.created, "model": job.model,
            "system_fingerprint": fingerprint, "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens)}


def chat_choice(index: int, text: str, finish_reason: str, logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
    return {"index": index,
            "message": {"role": "assistant", "content": text, "refusal": None, "annotations": []},
            "logprobs": chat_logprobs(logprobs) if logprobs is not None else None,
            "finish_reason": finish_reason}


def chat_chunk(job: Job, fingerprint: str, choices: list[dict[str, Any]], *, include_usage: bool,
               usage_: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk = {"id": job.id, "object": "chat.completion.chunk", "created": job.created, "model": job.model,
             "system_fingerprint": fingerprint, "choices": choices}
    if include_usage:
        chunk["usage"] = usage_
    return chunk


def chat_chunk_choice(index: int, delta: dict[str, Any], *, logprobs: list[TokenLogprob] | None = None,
                      finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta,
            "logprobs": chat_logprobs(logprobs) if logprobs is not None else None,
            "finish_reason": finish_reason}


def completion(job: Job, fingerprint: str, choices: list[dict[str, Any]], *, object_usage: dict[str, Any] | None,
               include_usage_key: bool = True) -> dict[str, Any]:
    body = {"id": job.id, "object": "text_completion", "created": job.created, "model": job.model,
            "system_fingerprint": fingerprint, "choices": choices}
    if include_usage_key:
        body["usage"] = object_usage
    return body


def completion_choice(index: int, text: str, finish_reason: str | None,
                      logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
