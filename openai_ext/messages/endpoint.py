"""POST /v1/messages and /v1/messages/count_tokens over the text family's machinery. No HTTP here.

This module is an endpoint of ``text.service.generate``, as chat is: ``prepare`` translates the
request and lets ``chat.prepare`` render, tokenize and plan it (on the prepare thread, where
every 400 happens); ``complete`` and ``stream`` run it in the generation queue with ``run_job``.
A stream sends ``message_start`` and a ping at once, before its turn comes, and pings while it
waits; a client that leaves stops the generation, as in chat. Context edits (context.py) are
applied before the translation; a threaded request's reply is handed to its ticket (threads.py)
once complete.

With MCP servers (connector.py), ``respond`` lists their tools between taking the place in line
and preparing, and the answer is written in passes: when a pass calls MCP tools, the server runs
them, on the event loop, each bounded by mcp_timeout, with the request's place set aside (the
slot serves others meanwhile; the next pass takes a turn in line again), and the next pass is the
same request with the answer so far, its calls and their results, as its last assistant turn; the
forced choice of the first pass (tool_choice any or tool) is auto then. It ends with a pass that
calls none of them, one that calls a client tool, or at max_tokens (all passes' output
together); once mcp_max_calls calls were run, the MCP tools are offered no more. Usage counts
every pass; the stop reason is the last pass's. A client that leaves stops the work, a call
under way included.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator

from fastapi import Request
from fastapi.responses import Response

from ..core.admission import Place
from ..core.errors import ContextLengthExceeded, InvalidRequestError
from ..core.streaming import Framing, until_disconnect
from ..text import chat, tools
from ..text.generation import ChoiceResult, Job, run_job
from ..text.output import OutputParser
from ..text.params import Plan
from ..text.service import TextService, enter, serve
from . import context, render, threads, translate
from .connector import Connector
from .protocol import CountTokensRequest, MessagesRequest
from .stream import PING, AnthropicFraming, Blocks

framing: Framing | None = AnthropicFraming()


@dataclass
class Turn:
    """A prepared Messages request: the chat job of its pass now, and what the Anthropic answer
    needs besides; the passes fill in what was sent and spent, and how it ended."""
    job: Job
    id: str
    stops: list[str]
    max_tokens: int
    context: dict[str, Any] | None = None    # the response's context_management
    ticket: threads.Ticket | None = None      # a thread's, where the reply is kept
    request: MessagesRequest | None = None    # as the model is shown it (context edits applied)
    connector: Connector | None = None        # the request's MCP servers
    asked: int = 0                            # the max_tokens of the pass now
    spent: list[int] = field(default_factory=lambda: [0, 0])      # input and output tokens, every pass
    sent: list[dict[str, Any]] = field(default_factory=list)      # the content events so far
    ended: tuple[str, str | None] = ("end_turn", None)             # stop_reason and stop_sequence

    @property
    def plan(self) -> Plan:
        return self.job.plan

    @property
    def clamped(self) -> bool:
        """The context left less room than max_tokens."""
        return self.plan.settings.max_new_tokens < self.asked


def _job(text: TextService, req: MessagesRequest, connector: Connector | None,
         budget: int | None = None) -> tuple[Job, translate.Translation]:
    """The chat job of a pass; ``budget``: the tokens a later pass may write (what max_tokens
    leaves after the passes before it)."""
    tr = translate.to_chat(req,
                           mcp=connector.offered() if connector is not None else None, later=budget is not None)
    if budget is not None:
        tr.chat.max_tokens = budget
    try:
        return chat.prepare(text, tr.chat, prefill=tr.prefill), tr
    except InvalidRequestError as e:
        raise translate.chat_error(e, tr.names, tr.tools) from None


def prepare(text: TextService, asked: threads.Asked, connector: Connector | None = None) -> Turn:
    edited = context.apply(asked.request, _counter(text))
    assert isinstance(edited.request, MessagesRequest)
    job, tr = _job(text, edited.request, connector)
    return Turn(job, render.message_id(), tr.stops, tr.max_tokens, edited.report(), asked.ticket,
                edited.request, connector, tr.max_tokens)


def _follow(text: TextService, turn: Turn, budget: int) -> Job:
    """The next pass: the request with the answer so far as its last assistant turn."""
    assert turn.request is not None
    req = turn.request.model_copy(update={"messages": threads.with_reply(turn.request.messages,
                                                                         render.fold(turn.sent))})
    return _job(text, req, turn.connector, budget)[0]


def _tokens(text: TextService, req: CountTokensRequest) -> int:
    """The prompt's tokens, rendered exactly as POST /v1/messages would render it."""
    tr = translate.to_chat(req)
    host = text.host
    try:
        given = chat.template_input(host, tr.chat, tools.parse(tr.chat))
        rendered = given.render(host)
    except InvalidRequestError as e:
        raise translate.chat_error(e, tr.names) from None
    return len(host.prompt_tokens(rendered.text + tr.prefill, given.images))   # an image as its tokens


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


async def _answer(text: TextService, turn: Turn, place: Place, *,
                  streamed: bool) -> AsyncGenerator[dict[str, Any], None]:
    """The answer's content events, pass after pass, in the turn the caller holds (``place``: set
    aside while an MCP call runs). Calls stream as they are generated when a grammar guarantees
    them, as in chat; a whole answer's are held until complete and validated, as in a
    non-streamed chat answer."""
    job, index = turn.job, -1
    connector = turn.connector
    servers = connector.servers() if connector is not None else {}
    while True:
        blocks = Blocks(OutputParser.for_job(job, incremental=None if streamed else False), mcp=servers, index=index)
        result: ChoiceResult | None = None
        async with contextlib.aclosing(run_job(text, job, None)) as events:
            async for ev in events:
                if ev.delta is not None:
                    outs = blocks.feed(ev.delta.text)
                elif ev.result is not None:
                    result, outs = ev.result, blocks.feed("", final=True)
                else:
                    continue
                for out in outs:
                    turn.sent.append(out)
                    yield out
        assert result is not None
        turn.spent[0] += job.prompt_tokens
        turn.spent[1] += result.tokens
        mine, theirs = blocks.made()
        turn.ended = render.stop_reason(result.finish_reason, result.stop, stops=turn.stops,
                                        called=bool(mine or theirs), clamped=turn.clamped)
        if not mine:
            return
        assert connector is not None, "an MCP call without MCP servers"
        for call in mine:
            try:
                arguments = json.loads(call["function"]["arguments"])
            except json.JSONDecodeError:
                arguments = None
            async with place.aside():
                got, failed = await connector.call(call["function"]["name"], arguments)
            for out in blocks.result(render.mcp_tool_result(render.mcp_tool_use_id(call["id"]), got, failed)):
                turn.sent.append(out)
                yield out
        if result.finish_reason == "length" or theirs:
            return    # max_tokens, or the client's tools to run: the stop reason says which
        budget = turn.max_tokens - turn.spent[1]
        if budget <= 0:
            turn.ended = ("max_tokens", None)
            return
        try:
            job = await text.prepared(_follow, text, turn, budget)
        except ContextLengthExceeded:
            turn.ended = ("model_context_window_exceeded", None)
            return
        turn.job, turn.asked, index = job, budget, blocks.index


async def complete(text: TextService, turn: Turn, place: Place) -> dict[str, Any]:
    async with place:
        async with contextlib.aclosing(_answer(text, turn, place, streamed=False)) as events:
            async for _ in events:
                pass
    content = render.fold(turn.sent)
    if turn.ticket is not None:
        turn.ticket.commit(turn.id, content)
    return render.message(turn.id, turn.job.model, content, *turn.ended, render.usage(*turn.spent), turn.context)


async def stream(text: TextService, turn: Turn, place: Place) -> AsyncGenerator[dict[str, Any], None]:
    job = turn.job
    start = render.message(turn.id, job.model, [], None, None, render.usage(job.prompt_tokens, 0))
    yield {"type": "message_start", "message": start}
    yield PING
    async with place:
        async with contextlib.aclosing(_answer(text, turn, place, streamed=True)) as events:
            async for out in events:
                yield out
    reason, sequence = turn.ended
    if turn.ticket is not None:
        turn.ticket.commit(turn.id, render.fold(turn.sent))
    delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": render.delta_usage(*turn.spent)}
    if turn.context is not None:
        delta["context_management"] = turn.context
    yield delta
    yield {"type": "message_stop"}


async def respond(text: TextService, request: Request, asked: threads.Asked, connector: Connector) -> Any:
    """A request with MCP servers, from its validated body to its response: text.service.generate's
    steps, with the servers checked and their tools listed between taking the place in line (a
    full line is told at once) and preparing (the tools are offered in the prompt)."""
    place = enter(text)
    try:
        listed = await until_disconnect(request, connector.open())
        if isinstance(listed, Response):   # the client left while the tools were listed
            place.release()
            return listed
        turn = await text.prepared(prepare, text, asked, connector)
    except BaseException:
        place.release()
        raise
    return await serve(text, request, place, events=stream(text, turn, place) if turn.plan.stream else None,
                       answer=lambda: complete(text, turn, place), framing=framing)
