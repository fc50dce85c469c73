"""POST /v1/chat/completions: messages in, a chat completion (or its chunks) out. No HTTP here."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

from . import params, responses
from .assembly import TokenLogprob, usage
from .errors import InvalidRequestError
from .generation import ChoiceResult, Job, Ticket, fit_prompt, new_job, run_job
from .hosts.base import Prompt
from .protocol import ChatCompletionRequest, ChatMessage
from .state import ApiState


def _text_of(message: ChatMessage, i: int) -> str:
    content = message.content
    if content is None:
        if message.role == "assistant" and message.tool_calls:
            return ""
        raise InvalidRequestError(f"messages[{i}].content is missing; {message.role} messages need content.",
                                  param=f"messages[{i}].content")
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type == "text":
            texts.append(part.text)
        elif part.type == "refusal":
            texts.append(part.refusal)
        else:
            raise InvalidRequestError(
                f"messages[{i}].content[{j}] is of type '{part.type}', which the loaded text model cannot read. "
                "Send text parts only.", param=f"messages[{i}].content[{j}].type")
    # Text parts are separate paragraphs of one message.
    return "\n".join(texts)


def normalize_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """OpenAI messages as plain dicts the chat templates understand: string content, and the
    developer role (OpenAI's newer name for system) as system."""
    out = []
    for i, m in enumerate(req.messages):
        if m.role == "function":
            raise InvalidRequestError("The legacy 'function' role is not supported; send tool results as "
                                      "role 'tool' with a tool_call_id.", param=f"messages[{i}].role")
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _text_of(m, i)}
        if m.name:
            msg["name"] = m.name
        if m.role == "tool":
            if not m.tool_call_id:
                raise InvalidRequestError(f"messages[{i}] has role 'tool' but no tool_call_id.",
                                          param=f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            msg["tool_calls"] = [tc.model_dump() for tc in m.tool_calls]
        out.append(msg)
    return out


def prepare(state: ApiState, req: ChatCompletionRequest) -> Job:
    host = state.host
    messages = normalize_messages(req)
    rendered = host.chat_prompt(messages, {})
    prompt = Prompt(rendered.text, host.tokenize(rendered.text), rendered.stops)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    prompt = fit_prompt(host, prompt, requested=requested, truncate=state.settings.truncate_prompt, param="messages")
    plan = params.plan(req, abilities=host.abilities, room=host.context_length() - len(prompt.tokens),
                       max_n=state.settings.max_n)
    return new_job("chatcmpl", [prompt], plan, host.model_id)


async def complete(state: ApiState, job: Job, ticket: Ticket) -> dict[str, Any]:
    results: list[ChoiceResult] = []
    async with contextlib.aclosing(run_job(state.host, job, ticket)) as events:
        async for ev in events:
            if ev.result is not None:
                results.append(ev.result)
    want_lp = job.plan.logprobs is not None
    choices = [responses.chat_choice(r.index, r.text, r.finish_reason, r.logprobs if want_lp else None)
               for r in results]
    return responses.chat_completion(job, state.fingerprint, choices, job.prompt_tokens,
                                     sum(r.tokens for r in results))


async def stream(state: ApiState, job: Job, ticket: Ticket) -> AsyncIterator[dict[str, Any]]:
    plan, fp = job.plan, state.fingerprint
    include_usage = plan.include_usage
    want_lp = plan.logprobs is not None
    started: set[int] = set()
    completion_tokens = 0

    def chunk(choice: dict[str, Any]) -> dict[str, Any]:
        return responses.chat_chunk(job, fp, [choice], include_usage=include_usage)

    async with contextlib.aclosing(run_job(state.host, job, ticket)) as events:
        async for ev in events:
            if ev.index not in started:
                started.add(ev.index)
                yield chunk(responses.chat_chunk_choice(
                    ev.index, {"role": "assistant", "content": "", "refusal": None},
                    logprobs=[] if want_lp else None))
            if ev.delta is not None:
                lp: list[TokenLogprob] | None = ev.delta.logprobs if want_lp else None
                if ev.delta.text or lp:
                    yield chunk(responses.chat_chunk_choice(ev.index, {"content": ev.delta.text}, logprobs=lp))
            elif ev.result is not None:
                completion_tokens += ev.result.tokens
                yield chunk(responses.chat_chunk_choice(ev.index, {}, finish_reason=ev.result.finish_reason))
    if include_usage:
        yield responses.chat_chunk(job, fp, [], include_usage=True,
                                   usage_=usage(job.prompt_tokens, completion_tokens))
