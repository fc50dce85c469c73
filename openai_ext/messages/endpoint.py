"""POST /v1/messages and /v1/messages/count_tokens over the text family's machinery. No HTTP here.

This module is an endpoint of ``text.service.generate``, as chat is: ``prepare`` translates the
request and lets ``chat.prepare`` render, tokenize and plan it (on the prepare thread, where
every 400 happens); ``complete`` and ``stream`` run it in the generation queue with ``run_job``.
A stream sends ``message_start`` and a ping at once, before its turn comes, and pings while it
waits; a client that leaves stops the generation, as in chat. Context edits (context.py) are
applied before the translation; a threaded request's reply is handed to its ticket (threads.py)
once complete.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, AsyncGenerator

from ..core.admission import Place
from ..core.errors import InvalidRequestError
from ..core.streaming import Framing
from ..text import chat, tools
from ..text.generation import ChoiceResult, Job, run_job
from ..text.output import OutputParser
from ..text.params import Plan
from ..text.service import TextService
from . import context, render, translate
from .protocol import CountTokensRequest, MessagesRequest
from .stream import PING, AnthropicFraming, Blocks

framing: Framing | None = AnthropicFraming()


@dataclass
class Turn:
    """A prepared Messages request: the chat job, and what the Anthropic answer needs besides."""
    job: Job
    id: str
    stops: list[str]
    max_tokens: int
    context: dict[str, Any] | None = None    # the response's context_management
    ticket: Any = None                        # a thread's, where the reply is kept (threads.Ticket)

    @property
    def plan(self) -> Plan:
        return self.job.plan

    @property
    def clamped(self) -> bool:
        """The context left less room than max_tokens."""
        return self.plan.settings.max_new_tokens < self.max_tokens

    def stop_reason(self, result: ChoiceResult, blocks: Blocks) -> tuple[str, str | None]:
        return render.stop_reason(result.finish_reason, result.stop, stops=self.stops, called=blocks.called,
                                  clamped=self.clamped)


def prepare(text: TextService, req: MessagesRequest) -> Turn:
    edited = context.apply(req, _counter(text))
    tr = translate.to_chat(edited.request, allow_unknown=text.settings.allow_unknown_fields)
    try:
        job = chat.prepare(text, tr.chat, prefill=tr.prefill)
    except InvalidRequestError as e:
        raise translate.chat_error(e, tr.names) from None
    return Turn(job, render.message_id(), tr.stops, tr.max_tokens, edited.report(), req._ticket)


def _tokens(text: TextService, req: CountTokensRequest) -> int:
    """The prompt's tokens, rendered exactly as POST /v1/messages would render it."""
    tr = translate.to_chat(req, allow_unknown=text.settings.allow_unknown_fields)
    host = text.host
    try:
        rendered = chat.template_input(host, tr.chat, tools.parse(tr.chat)).render(host)
    except InvalidRequestError as e:
        raise translate.chat_error(e, tr.names) from None
    return len(host.tokenize(rendered.text + tr.prefill))


def _counter(text: TextService) -> context.Count:
    return lambda req: _tokens(text, req)


def count_tokens(text: TextService, req: CountTokensRequest) -> dict[str, Any]:
    """The prompt's tokens after the request's context edits; with editing asked for, the count
    before them too (original_input_tokens), as Anthropic reports it."""
    edited = context.apply(req, _counter(text))
    out: dict[str, Any] = {"input_tokens": _tokens(text, edited.request)}
    if req.context_management is not None:
        before = edited.tokens_before if edited.applied else out["input_tokens"]
        out["context_management"] = {"original_input_tokens": before}
    return out


def _blocks(turn: Turn, *, incremental: bool | None = None) -> Blocks:
    return Blocks(OutputParser.for_job(turn.job, incremental=incremental))


async def complete(text: TextService, turn: Turn, place: Place) -> dict[str, Any]:
    result: ChoiceResult | None = None
    async with contextlib.aclosing(run_job(text, turn.job, place)) as events:
        async for ev in events:
            if ev.result is not None:
                result = ev.result
    assert result is not None
    # Calls are held until complete and validated, as in a non-streamed chat answer.
    blocks = _blocks(turn, incremental=False)
    content = render.fold(blocks.feed(result.text, final=True))
    reason, sequence = turn.stop_reason(result, blocks)
    if turn.ticket is not None:
        turn.ticket.commit(turn.id, content)
    return render.message(turn.id, turn.job.model, content, reason, sequence,
                          render.usage(turn.job.prompt_tokens, result.tokens), turn.context)


async def stream(text: TextService, turn: Turn, place: Place) -> AsyncGenerator[dict[str, Any], None]:
    job = turn.job
    start = render.message(turn.id, job.model, [], None, None, render.usage(job.prompt_tokens, 0))
    yield {"type": "message_start", "message": start}
    yield PING
    # Calls stream as they are generated when a grammar guarantees them, as in chat.
    blocks = _blocks(turn)
    result: ChoiceResult | None = None
    sent: list[dict[str, Any]] = []     # the content events, for a thread to keep the reply
    async with contextlib.aclosing(run_job(text, job, place)) as events:
        async for ev in events:
            if ev.delta is not None:
                for out in blocks.feed(ev.delta.text):
                    sent.append(out)
                    yield out
            elif ev.result is not None:
                result = ev.result
                for out in blocks.feed("", final=True):
                    sent.append(out)
                    yield out
    assert result is not None
    reason, sequence = turn.stop_reason(result, blocks)
    if turn.ticket is not None:
        turn.ticket.commit(turn.id, render.fold(sent))
    delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": render.delta_usage(job.prompt_tokens, result.tokens)}
    if turn.context is not None:
        delta["context_management"] = turn.context
    yield delta
    yield {"type": "message_stop"}
