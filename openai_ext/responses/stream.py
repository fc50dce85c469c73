"""A response's generation as OpenAI's semantic events.

``events()`` runs a prepared ``Turn`` (turn.py) through the text family's ``run_job`` and yields the events
OpenAI sends, each with its ``sequence_number``: ``response.created`` (and ``response.queued`` in
the background), ``response.in_progress`` once its turn in line comes, then per output item
``output_item.added``, ``content_part.added``, ``output_text.delta`` ... ``output_item.done``, and
one of ``response.completed`` or ``response.incomplete``. Every mode consumes it: a stream frames
the events (framing.py: ``event:`` and ``data:`` lines), a plain request keeps only the final
Response object (``complete``), a background run logs them for pollers and followers.

Text is split into messages and function calls by the text family's ``ToolCallStream``, which
also validates the calls, so what a client sees here is what chat would send, in other clothes.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncGenerator, Union

from ..core.admission import Place
from ..core.errors import OpenAIError
from ..hosts.base import TokenLogprob
from ..text import tools
from ..text.generation import ChoiceResult, Job, run_job
from ..text.output import OutputParser, Thinking
from ..text.service import TextService
from . import compaction as compaction_
from . import file_search, mcp, render
from .item_types import (
    FileSearchCallItem,
    FunctionCallItem,
    McpApprovalRequestItem,
    McpCallItem,
    MessageItem,
    OutputTextPart,
    ReasoningItem,
    Status,
)
from .items import new_id
from .turn import Turn


def _text_part(item: MessageItem) -> OutputTextPart:
    """The one part of a message this builder makes: its output_text."""
    part = item["content"][0]
    assert part["type"] == "output_text"
    return part


# A call the model is making: a client's function, an MCP tool's (run here, or asked for approval), a search
OpenCall = Union[FunctionCallItem, McpCallItem, McpApprovalRequestItem, FileSearchCallItem]


class _Output:
    """Builds the output items from generated text, event by event."""

    def __init__(self, turn: Turn):
        self.turn = turn
        self.state = turn.state
        # The one parser: thinking, text and calls cut as for every family (calls streamed as
        # they are generated when a grammar guarantees them).
        self.output = OutputParser.for_job(turn.job)
        self.message: MessageItem | None = None         # the open message item
        self.message_index = -1
        self.open_calls: dict[int, tuple[int, OpenCall]] = {}   # call index -> (output index, item)
        self.pending_lp: list[TokenLogprob] = []
        # A reasoning model's thinking becomes a reasoning item ahead of the answer. Items open
        # at their first text, so the order of the output is the order of generation.
        self.reasoning: ReasoningItem | None = None
        self.reasoning_index = -1
        self.start = len(self.state.output)                         # this pass's items come after
        self.to_run: list[tuple[int, McpCallItem | FileSearchCallItem]] = []   # calls to run here (output index, item)
        self.asked = False                                          # an MCP call awaits approval
        self.handed = False                                         # a client's function was called
        self.status = "completed"

    # text ------------------------------------------------------------------------------------
    def feed(self, text: str, logprobs: list[TokenLogprob], *, final: bool = False) -> list[dict[str, Any]]:
        if self.turn.want_logprobs:
            self.pending_lp.extend(logprobs)
        out: list[dict[str, Any]] = []
        answer: list[tools.Content | tools.CallDelta] = []
        for e in self.output.feed(text, final=final):
            if isinstance(e, Thinking):
                out += self._reason(e.text)
            else:
                answer.append(e)
        if answer or final:
            out += self._close_reasoning()
        return out + self._apply(answer)

    def _reason(self, text: str) -> list[dict[str, Any]]:
        out = []
        if self.reasoning is None:
            item = self.reasoning = ReasoningItem(id=new_id("rs"), type="reasoning", summary=[], content=[],
                                                  status="in_progress")
            self.reasoning_index = len(self.state.output)
            self.state.output.append(item)
            where = {"item_id": item["id"], "output_index": self.reasoning_index}
            out += [self.turn.event("response.output_item.added", output_index=self.reasoning_index, item=dict(
                        item, content=[])),
                    self.turn.event("response.content_part.added", **where, content_index=0,
                                    part={"type": "reasoning_text", "text": ""})]
            item["content"].append({"type": "reasoning_text", "text": ""})
        item = self.reasoning
        item["content"][0]["text"] += text
        out.append(self.turn.event("response.reasoning_text.delta", item_id=item["id"],
                                   output_index=self.reasoning_index, content_index=0, delta=text))
        return out

    def _close_reasoning(self) -> list[dict[str, Any]]:
        item, self.reasoning = self.reasoning, None
        if item is None:
            return []
        item["status"] = "completed"
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": self.reasoning_index}
        return [self.turn.event("response.reasoning_text.done", **where, content_index=0, text=part["text"]),
                self.turn.event("response.content_part.done", **where, content_index=0, part=dict(part)),
                self.turn.event("response.output_item.done", output_index=self.reasoning_index,
                                item=dict(item, content=[dict(part)]))]

    def _apply(self, events: list[tools.Content | tools.CallDelta]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in events:
            out += (self._text(e.text) if e.text else []) if isinstance(e, tools.Content) else self._call(e)
        if self.output.stream is not None:
            out += self._close_calls()
        return out

    def _text(self, text: str) -> list[dict[str, Any]]:
        turn, out = self.turn, []
        if self.message is None:
            out += self._open_message()
        lps, self.pending_lp = self.pending_lp, []
        assert self.message is not None   # (opened above)
        part = _text_part(self.message)
        part["text"] += text
        entries = render.output_logprobs(lps)   # the delta's, and the part's (both specs let bytes ride on both)
        part["logprobs"].extend(entries)
        out.append(turn.event("response.output_text.delta", item_id=self.message["id"], output_index=self.message_index,
                              content_index=0, delta=text, logprobs=entries))
        return out

    def _open_message(self) -> list[dict[str, Any]]:
        item = render.message_item(new_id("msg"), "in_progress", [])
        self.message_index = len(self.state.output)
        self.state.output.append(item)
        events = [self.turn.event("response.output_item.added", output_index=self.message_index,
                                  item=render.message_item(item["id"], "in_progress", [])),
                  self.turn.event("response.content_part.added", item_id=item["id"], output_index=self.message_index,
                                  content_index=0, part=render.text_part())]
        item["content"].append(render.text_part())
        self.message = item
        return events

    def _close_message(self, status: Status) -> list[dict[str, Any]]:
        item, self.message = self.message, None
        if item is None:
            return []
        item["status"] = status
        part = _text_part(item)
        where = {"item_id": item["id"], "output_index": self.message_index}
        return [*file_search.cite(self.turn, part, where),
                self.turn.event("response.output_text.done", **where, content_index=0, text=part["text"],
                                logprobs=list(part["logprobs"])),
                self.turn.event("response.content_part.done", **where, content_index=0, part=dict(part)),
                self.turn.event("response.output_item.done", output_index=self.message_index,
                                item=render.message_item(item["id"], status, [part.copy()]))]

    # calls -----------------------------------------------------------------------------------
    def _allowed(self, index: int) -> bool:
        limit = self.turn.max_tool_calls
        return limit is None or index < limit

    def _call(self, e: tools.CallDelta) -> list[dict[str, Any]]:
        if not self._allowed(e.index):
            return []   # max_tool_calls: calls past the limit are dropped
        turn = self.turn
        if e.id is not None:
            out = self._close_message("completed")
            server = turn.tools.mcp_of(e.name or "") if turn.tools else None
            item: OpenCall
            if turn.search is not None and turn.tools is not None and e.name == turn.tools.search:
                item = file_search.call_item()
            elif server is not None and turn.servers is not None:
                label, name = server
                ask = turn.servers.needs_approval(label, name)
                item = mcp.approval_request(label, name, "") if ask else mcp.call_item(label, name, "")
            else:
                namespace, name = turn.tools.call(e.name or "") if turn.tools else (None, e.name or "")
                item = render.call_item(new_id("fc"), "in_progress", e.id, name, "", namespace)
                self.handed = True
            index = -1   # a request for approval joins the output whole, once made (a cut one asks nothing)
            if item["type"] != "mcp_approval_request":
                index = len(self.state.output)
                self.state.output.append(item)
                out.append(turn.event("response.output_item.added", output_index=index, item=dict(item)))
            if item["type"] == "file_search_call":
                out.append(turn.event("response.file_search_call.in_progress", item_id=item["id"], output_index=index))
            self.open_calls[e.index] = (index, item)
            if e.arguments:
                out += self._call(tools.CallDelta(e.index, e.arguments))
            return out
        index, item = self.open_calls[e.index]
        if item["type"] == "file_search_call":
            return []   # its queries are read once the call is complete (no events carry them)
        item["arguments"] += e.arguments
        kind = {"function_call": "function_call_arguments", "mcp_call": "mcp_call_arguments"}.get(item["type"])
        if kind is None:
            return []
        return [turn.event(f"response.{kind}.delta", item_id=item["id"], output_index=index, delta=e.arguments)]

    def _close_calls(self, *, final: bool = False) -> list[dict[str, Any]]:
        """Closes the calls ToolCallStream has completed (its ``calls[k]`` is call k); at the end,
        a call still open was cut short and stays incomplete."""
        out: list[dict[str, Any]] = []
        for k in sorted(self.open_calls):
            calls = self.output.calls
            complete = k < len(calls) and k not in self.output.cut   # cut: arguments unfinished
            if not complete and not final:
                continue
            index, item = self.open_calls.pop(k)
            if item["type"] == "file_search_call":   # run once complete (its end told then), else cut
                asked = self.turn.search.question if self.turn.search is not None else ""
                item["queries"] = file_search.queries_of(calls[k]["function"]["arguments"] if k < len(calls) else "",
                                                         asked)
                if complete:
                    self.to_run.append((index, item))
                    continue
                item["status"] = "incomplete"
                out.append(self.turn.event("response.output_item.done", output_index=index, item=dict(item)))
                continue
            if k < len(calls):
                item["arguments"] = calls[k]["function"]["arguments"]
            if item["type"] == "mcp_approval_request":
                if complete:
                    self.asked = True
                    index = len(self.state.output)
                    self.state.output.append(item)
                    out += [self.turn.event("response.output_item.added", output_index=index, item=dict(item)),
                            self.turn.event("response.output_item.done", output_index=index, item=dict(item))]
                continue
            if item["type"] == "mcp_call":
                out.append(self.turn.event("response.mcp_call_arguments.done", item_id=item["id"],
                                           output_index=index, arguments=item["arguments"]))
                if complete:
                    self.to_run.append((index, item))   # its end is told once it has run
                    continue
                item["status"] = "incomplete"
            else:
                item["status"] = "completed" if complete else "incomplete"
                out.append(self.turn.event("response.function_call_arguments.done", item_id=item["id"],
                                           output_index=index, name=item["name"], arguments=item["arguments"]))
            out.append(self.turn.event("response.output_item.done", output_index=index, item=dict(item)))
        return out

    # the end ---------------------------------------------------------------------------------
    def finish(self, result: ChoiceResult) -> list[dict[str, Any]]:
        out = self.feed("", [], final=True)          # whatever was held back, or cut short
        cut = result.finish_reason == "length"
        status: Status = "incomplete" if cut else "completed"
        if self.output.stream is not None:
            out += self._close_calls(final=True)
        if cut:
            for index, item in self.to_run:          # calls made before the cut are not run
                item["status"] = "incomplete"
                out.append(self.turn.event("response.output_item.done", output_index=index, item=dict(item)))
            self.to_run = []
        if not self.to_run and not any(item["type"] != "reasoning" for item in self.state.output[self.start:]):
            out += self._open_message()              # an empty answer is still a message
        out += self._close_message(status)
        turn = self.turn
        turn.spent[0] += turn.job.prompt_tokens
        turn.spent[1] += result.tokens
        spent = turn.compaction.spent if turn.compaction is not None else (0, 0)
        self.state.usage = render.usage(turn.spent[0] + spent[0], turn.spent[1] + spent[1])
        self.status = status
        if not self.to_run:
            self.state.finish(status, reason="max_output_tokens" if cut else None)
        return out


async def events(text: TextService, turn: Turn, place: Place) -> AsyncGenerator[dict[str, Any], None]:
    """The response's events, from ``response.created`` to its end; leaving early (a client gone,
    a cancel) stops the generation, and the response is stored as it ended, either way."""
    state = turn.state
    try:
        yield turn.event("response.created", response=state.snapshot())
        if state.status == "queued":
            yield turn.event("response.queued", response=state.snapshot())
        async with place:
            state.status = "in_progress"
            yield turn.event("response.in_progress", response=state.snapshot())
            # Taking the turn here (run_job is told it is held) is what lets
            # response.in_progress, and a background response's status, say when work really starts.
            if turn.compaction is not None:
                for e in await _compact(text, turn):
                    yield e
            if turn.answer:
                async with contextlib.aclosing(_answer(text, turn, place)) as answered:
                    async for e in answered:
                        yield e
        # Stored before it is told: a client that reads "completed" finds it stored. A store that
        # fails here raises, and the client is told the response failed, naming the store.
        await turn.settle()
        yield turn.event(f"response.{state.status}", response=state.snapshot())
    except BaseException as e:
        turn.fail(e)
        raise
    finally:
        # A response that did not end well (failed, cancelled, its client gone) is stored too; a
        # store that fails now has its end owed (store.py), and nothing is left to tell.
        with contextlib.suppress(OpenAIError):
            await turn.settle()


async def _answer(text: TextService, turn: Turn, place: Place) -> AsyncGenerator[dict[str, Any], None]:
    """The answer's events: one pass of generation, or, with MCP tools, a pass after each round of
    calls the model made (and first the tool lists and any calls approved since), until it
    answers, asks for approval, calls a client's function, or its budget is spent."""
    servers = turn.servers
    if servers is not None:
        for e in mcp.opening(turn):
            yield e
        approved = mcp.approved_calls(turn)
        if approved:
            async with contextlib.aclosing(mcp.run_calls(turn, approved, place, opened=False)) as ran:
                async for e in ran:
                    yield e
            turn.job = await _next_job(text, turn, {})
    while True:
        out = _Output(turn)
        async with contextlib.aclosing(run_job(text, turn.job, None)) as generated:
            async for ev in generated:
                if ev.delta is not None:
                    for e in out.feed(ev.delta.text, ev.delta.logprobs):
                        yield e
                elif ev.result is not None:
                    for e in out.finish(ev.result):
                        yield e
        if not out.to_run:
            return
        assert turn.again is not None   # (only a call this server runs is run: mcp, file_search)
        for index, call in out.to_run:
            run = file_search.run_calls(turn, [(index, call)], place) if call["type"] == "file_search_call" else \
                mcp.run_calls(turn, [(index, call)], place)
            async with contextlib.aclosing(run) as ran:
                async for e in ran:
                    yield e
        left = None if turn.max_output_tokens is None else turn.max_output_tokens - turn.spent[1]
        if out.asked or out.handed or (left is not None and left <= 0):
            # the client has a call to answer (an approval, or its own function), or no budget is left
            waits = out.asked or out.handed
            turn.state.finish("completed" if waits else "incomplete", reason=None if waits else "max_output_tokens")
            return
        turn.job = await _next_job(text, turn, {"max_output_tokens": left})


async def _next_job(text: TextService, turn: Turn, update: dict[str, Any]) -> Job:
    """The job of the next pass: the context, and what the response has produced so far."""
    assert turn.again is not None
    produced = [it for it in turn.state.output if it["type"] != "compaction"]
    spent = any(runs is not None and runs.ran >= runs.limit for runs in (turn.servers, turn.search))
    update = {"tool_choice": mcp.next_choice(turn.tool_choice, spent), **update}
    return await text.tokenizer_work(turn.again, produced, update)


async def _compact(text: TextService, turn: Turn) -> list[dict[str, Any]]:
    """The compaction ahead of the answer: the summary written in this turn, the compaction item
    as the first output item, and the answer's job made again from the compacted context."""
    plan = turn.compaction
    assert plan is not None, "a compaction pass for a turn that needs none"
    summary = await compaction_.summarize(text, plan)
    item = compaction_.item(summary, plan.kept)
    state = turn.state
    index = len(state.output)
    state.output.append(item)
    if turn.answer and turn.rebuild is not None:
        turn.compacted = [item]
        turn.job = await text.tokenizer_work(turn.rebuild, [item])
    else:
        state.usage = render.usage(*plan.spent)
        state.finish("completed")
    return [turn.event("response.output_item.added", output_index=index, item=dict(item)),
            turn.event("response.output_item.done", output_index=index, item=dict(item))]


async def complete(text: TextService, turn: Turn, place: Place) -> dict[str, Any]:
    """A non-streamed response: the events are run through, the final Response object returned."""
    async with contextlib.aclosing(events(text, turn, place)) as evs:
        async for _ in evs:
            pass
    return turn.state.snapshot()

