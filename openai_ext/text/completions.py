"""POST /v1/completions: prompts in, a text completion (or its chunks) out. No HTTP here."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncGenerator, cast

from ..core.admission import Place
from ..core.errors import InvalidRequestError
from ..core.streaming import Framing
from ..hosts.base import Host, Prompt, TokenLogprob
from . import params, render
from .assembly import usage
from .generation import ChoiceResult, Job, best_of, bound_text, fit_prompt, new_job, run_job
from .protocol import CompletionRequest
from .service import TextService

# This endpoint streams in OpenAI's framing (text.service.TextEndpoint).
framing: Framing | None = None


def _prompts(host: Host, req: CompletionRequest, truncate: bool, max_prompts: int) -> list[Prompt]:
    raw = req.prompt
    if isinstance(raw, str):
        items: list[str | list[int]] = [raw]
    elif raw and isinstance(raw[0], int):
        items = [raw]  # one prompt given as token ids
    else:
        # strings or token-id lists (a list of ints is one prompt, above)
        items = list(cast("list[str | list[int]]", raw))
    if not items:
        raise InvalidRequestError("prompt is an empty list; send at least one prompt.", param="prompt")
    params.check_prompts(len(items), max_prompts)   # before any of them is tokenized
    vocab = host.abilities.vocab_size
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = bound_text(host, item, truncate=truncate, param="prompt")
            if req.suffix and host.abilities.fim:  # without FIM tokens, params.plan() refuses suffix
                tokens = host.fim_prompt(item, req.suffix)
                prompts.append(Prompt(item, tokens))
            else:
                # An empty prompt means "from the start of a new document", as at OpenAI.
                prompts.append(Prompt(item, host.tokenize(item) or host.document_start()))
        else:
            bad = [t for t in item if t < 0 or (vocab is not None and t >= vocab)]
            if bad:
                raise InvalidRequestError(f"prompt[{i}] holds token id {bad[0]}, which is not in the loaded model's "
                                          f"vocabulary of {vocab} tokens.", param="prompt")
            prompts.append(Prompt(host.detokenize(item), list(item)))
    return prompts


def prepare(text: TextService, req: CompletionRequest) -> Job:
    host = text.host
    if req.echo and req.suffix:
        raise InvalidRequestError("echo and suffix cannot be used together.", param="echo")
    prompts = [fit_prompt(host, p, requested=req.max_tokens, truncate=text.settings.truncate_prompt, param="prompt")
               for p in _prompts(host, req, text.settings.truncate_prompt, text.settings.max_prompts)]
    room = host.context_length() - max(len(p.tokens) for p in prompts)
    plan = params.plan(req, abilities=host.abilities, room=room, max_n=text.settings.max_n)
    host.check_settings(plan.settings)
    if plan.echo and plan.logprobs is not None:
        host.check_prompt_scoring()
    job = new_job("cmpl", prompts, plan, host)
    if plan.echo:
        job.echo = [p.text for p in prompts]
    return job


async def complete(text: TextService, job: Job, place: Place) -> dict[str, Any]:
    plan = job.plan
    results: list[ChoiceResult] = []
    prompt_lp: dict[int, list[TokenLogprob]] = {}
    async with contextlib.aclosing(run_job(text, job, place)) as events:
        async for ev in events:
            if ev.prompt_logprobs is not None:
                prompt_lp[ev.index // plan.best_of] = ev.prompt_logprobs
            if ev.result is not None:
                results.append(ev.result)
    choices = []
    for p in range(len(job.prompts)):
        group = results[p * plan.best_of:(p + 1) * plan.best_of]
        if plan.best_of > plan.n:
            group = best_of(group, plan.n)
        echo = job.echo[p] if plan.echo else ""
        for i, r in enumerate(group):
            lp = None
            if plan.logprobs is not None:
                scored = (prompt_lp.get(p) or []) + r.logprobs if plan.echo else r.logprobs
                lp = render.completion_logprobs(scored)
            choices.append(render.completion_choice(job.index(p, i), echo + r.text, r.finish_reason, lp))
    # Every candidate was generated, so best_of counts them all, as OpenAI bills them.
    return render.completion(job, text.fingerprint, choices, usage(job.prompt_tokens, sum(r.tokens for r in results)))


async def stream(text: TextService, job: Job, place: Place) -> AsyncGenerator[dict[str, Any], None]:
    plan, fp = job.plan, text.fingerprint
    include_usage = plan.include_usage
    want_lp = plan.logprobs is not None
    position: dict[int, int] = {}  # characters sent so far per choice, for text_offset
    completion_tokens = 0

    def chunk(index: int, text: str, finish: str | None, lp: dict[str, Any] | None) -> dict[str, Any]:
        return render.completion(job, fp, [render.completion_choice(index, text, finish, lp)])

    async with contextlib.aclosing(run_job(text, job, place)) as events:
        async for ev in events:
            p = ev.index // plan.n
            if ev.index not in position:
                position[ev.index] = 0
                if plan.echo:
                    lp = render.completion_logprobs(ev.prompt_logprobs or []) if want_lp else None
                    yield chunk(ev.index, job.echo[p], None, lp)
                    position[ev.index] = len(job.echo[p])
            if ev.delta is not None and (ev.delta.text or (want_lp and ev.delta.logprobs)):
                lp = render.completion_logprobs(ev.delta.logprobs, offset=position[ev.index]) if want_lp else None
                position[ev.index] += len(ev.delta.text)
                yield chunk(ev.index, ev.delta.text, None, lp)
            elif ev.result is not None:
                completion_tokens += ev.result.tokens
                yield chunk(ev.index, "", ev.result.finish_reason, None)
    if include_usage:
        yield render.completion(job, fp, [], usage(job.prompt_tokens, completion_tokens))
