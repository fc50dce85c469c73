"""Compaction: the older part of a conversation, summarised by the model itself into one item.

A ``compaction`` item stands for everything that came before it. Its ``encrypted_content`` is
opaque to clients (as at OpenAI) but not secret: this server's own, versioned encoding of the
summary and of the recent items it keeps word for word. When a context is rendered, the items
before its latest compaction item are dropped and the item becomes its summary (folded into the
system message) followed by the items it kept (``expand``), so a client may send the whole
history, or drop what came before the compaction item, or continue with previous_response_id:
the prompt is the same.

It is made in two places: ``POST /v1/responses/compact`` (the compacted window: the user
messages kept, then the compaction item) and ``context_management`` on ``POST /v1/responses``
(when the prompt passes the threshold, the response's output starts with a compaction item and
the answer is generated from the compacted context). Either way the summary is written by the
loaded model in the request's own place in line, chunk by chunk when the older part is longer
than the context (each pass folds the previous summary into the next), with a bounded number of
passes: work per request is bounded by the context, not by the length of the history.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.errors import InvalidRequestError
from ..hosts.base import Host
from ..text import chat
from ..text.generation import Job, run_job
from ..text.output import OutputParser
from ..text.protocol import ChatCompletionRequest
from ..text.service import TextService
from ..text.tools import Content
from . import file_search, mcp
from . import items as items_
from .compacted import KEPT_BYTES, MAX_KEPT, Kept, decode, encode, size
from .item_types import CompactionItem, Item, Items, SummaryItem

MAX_PASSES = 8                 # summarising passes per compaction; older text beyond is left out
SUMMARY_ITEM: Literal["compaction_summary"] = "compaction_summary"   # the item a compaction expands into

INSTRUCTIONS = (
    "You are compacting a conversation so that it can go on in a smaller context. Write a concise summary "
    "of the conversation below for the assistant who will continue it: the user's goals and requests, "
    "decisions made, facts learned, tool calls and the results that matter, and what remains to be done. "
    "Write only the summary.")


# the item ------------------------------------------------------------------------------------
def item(summary: str, kept: Items) -> CompactionItem:
    # status: Open Responses requires one on every item (its schema of this one has none; both specs let it by)
    return CompactionItem(id=items_.new_id("cmp"), type="compaction", status="completed",
                          encrypted_content=encode(summary, kept))


def expand(context: Items) -> Items:
    """The context as the model sees it: from its latest compaction item on, that item standing
    for everything before it."""
    last = next((i for i in range(len(context) - 1, -1, -1) if context[i]["type"] == "compaction"), None)
    if last is None:
        return context
    latest = context[last]
    assert latest["type"] == "compaction"
    summary, kept = decode(latest["encrypted_content"], "input")   # (checked when it came in: items.py)
    head: Items = [SummaryItem(type=SUMMARY_ITEM, text=summary)] if summary else []
    return [*head, *kept, *context[last + 1:]]


# when -----------------------------------------------------------------------------------------
@dataclass
class Managed:
    """``context_management`` on a response: compact when the prompt passes ``threshold`` tokens
    (None: only when it would not leave room for the answer)."""
    threshold: int | None


def managed(entries: list[dict[str, Any]] | None) -> Managed | None:
    """The request's context_management, checked as OpenAI's spec has it."""
    if entries is None:
        return None
    if not entries:
        raise InvalidRequestError("context_management must hold at least one entry, e.g. [{\"type\": "
                                  "\"compaction\", \"compact_threshold\": 20000}]; or leave it out.",
                                  param="context_management")
    thresholds: list[int] = []
    for i, entry in enumerate(entries):
        here = f"context_management[{i}]"
        if entry.get("type") != "compaction":
            raise InvalidRequestError(f"Invalid value for '{here}.type': {entry.get('type')!r}. The only context "
                                      "management type is 'compaction'.", param=f"{here}.type")
        for key in entry:
            if key not in ("type", "compact_threshold"):
                raise InvalidRequestError(f"Unknown parameter: '{here}.{key}'.", param=f"{here}.{key}",
                                          code="unknown_parameter")
        value = entry.get("compact_threshold")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1000:
                raise InvalidRequestError(f"{here}.compact_threshold must be an integer of at least 1000 (tokens), "
                                          "or null.", param=f"{here}.compact_threshold")
            thresholds.append(value)
    return Managed(min(thresholds) if thresholds else None)


def limit(ctx: int, max_output_tokens: int | None, manage: Managed | None) -> int:
    """The most prompt tokens a response's context may take before it is compacted."""
    room = ctx - (max_output_tokens or min(ctx // 4, 1024))
    if manage is not None and manage.threshold is not None:
        room = min(room, manage.threshold)
    return max(1, room)


# what is summarised, what is kept ------------------------------------------------------------
def line(it: Item) -> str:
    """One item as a line of the transcript the summary is written from."""
    if it["type"] == "compaction_summary":
        return f"(Summary of what came before: {it['text']})"
    if it["type"] == "message":
        return f"{it['role'].capitalize()}: {items_.text_of(it)}"
    if it["type"] == "function_call":
        return f"Assistant called {it['name']}({it['arguments']}) [call {it['call_id']}]"
    if it["type"] == "function_call_output":
        return f"Result of call {it['call_id']}: {items_.text_of(it)}"
    if it["type"] == "mcp_call" and it.get("status") in ("completed", "failed"):
        error = it.get("error")
        result = it.get("output") if error is None else mcp.error_text(error)
        return f"Assistant called {it['server_label']}.{it['name']}({it['arguments']}), which returned: {result}"
    if it["type"] == "file_search_call" and it.get("status") in ("completed", "failed"):
        return f"Assistant searched the files for {it.get('queries')}, and found: {file_search.for_model(it)}"
    return ""   # reasoning is not shown to the model, so it is not summarised either


def summary_tokens(ctx: int) -> int:
    """The longest summary a pass may write."""
    return max(64, min(1024, ctx // 8))


@dataclass
class Plan:
    """One compaction, decided on the prepare thread and run in the request's turn."""
    chunks: list[str]                    # the transcript, in parts that each fit one pass
    kept: Items                          # items carried word for word
    model: str | None
    omitted: int = 0                     # older items beyond MAX_PASSES, left out
    longest: int = 1024                  # the summary's tokens at most: less than what it stands for
    spent: list[int] = field(default_factory=lambda: [0, 0])   # tokens in, out, over every pass


def _tokens(host: Host, text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to at most ``limit`` tokens (its start and its end kept), and its count. The
    tokenizer sees at most a few characters per allowed token, whatever the text's length."""
    cap = limit * 6
    if len(text) > cap:
        text = text[:cap // 2] + " [...] " + text[-cap // 2:]
    ids = host.tokenize(text, add_bos=False)
    if len(ids) <= limit:
        return text, len(ids)
    half = max(1, limit // 2 - 4)
    text = host.detokenize(ids[:half]) + " [...] " + host.detokenize(ids[-half:])
    return text, len(host.tokenize(text, add_bos=False))


def prepare(host: Host, older: Items, kept: Items, model: str | None,
         instructions: str | None = None) -> Plan:
    """The compaction of ``older``: its transcript in parts, and a summary that is shorter than
    what it summarises (a third of it at most), whatever the model would write."""
    chunks, omitted, total = chunk(host, older, instructions)
    longest = min(summary_tokens(host.context_length()), max(64, total // 3))
    return Plan(chunks, Kept(kept), model, omitted, longest)


def chunk(host: Host, older: Items, instructions: str | None) -> tuple[list[str], int, int]:
    """The transcript of ``older`` in parts that each fit one pass beside the instructions and the
    previous pass's summary, newest parts kept when there are more than MAX_PASSES; with the
    number of items left out, and the tokens of what is kept."""
    ctx = host.context_length()
    budget = max(64, ctx - 2 * summary_tokens(ctx) - 256)
    lines = ([f"(The assistant's instructions: {instructions})"] if instructions else []) + \
        [x for x in (line(it) for it in older) if x]
    parts: list[list[str]] = [[]]
    used, taken, total = 0, 0, 0
    for text in reversed(lines):   # newest first, so a long history loses its oldest lines
        text, n = _tokens(host, text, budget)
        total += n
        if used + n > budget and parts[-1]:
            if len(parts) == MAX_PASSES:
                break
            parts.append([])
            used = 0
        parts[-1].insert(0, text)
        used += n + 1
        taken += 1
    chunks = ["\n".join(p) for p in reversed(parts) if p]
    return chunks, len(lines) - taken, total


def split(host: Host, context: Items, budget: int, *, users_only: bool,
          starts: list[int]) -> tuple[Items, Items]:
    """(older, kept): kept is what fits ``budget`` tokens, word for word, and what a compaction
    item holds (compacted.KEPT_BYTES of JSON, MAX_KEPT items). For a response (``users_only``
    false) it is the newest items from a point where the context may start (``starts``), never
    an output without its call; at least the last such run is kept, as the answer needs it. For
    /compact it is the newest user messages, as OpenAI keeps user messages."""
    def cost(its: Items) -> int:
        return sum(len(host.tokenize(line(it)[: budget * 6], add_bos=False)) + 4 for it in its)

    if users_only:
        kept_at: set[int] = set()
        used = nbytes = 0
        for i in range(len(context) - 1, -1, -1):
            it = context[i]
            if it["type"] == "message" and it["role"] == "user":
                used, nbytes = used + cost([it]), nbytes + size(it)
                if used > budget or nbytes > KEPT_BYTES or len(kept_at) == MAX_KEPT:
                    break
                kept_at.add(i)
        return ([it for i, it in enumerate(context) if i not in kept_at],
                [it for i, it in enumerate(context) if i in kept_at])
    whole = _whole(context)
    # the least that is kept: the newest run that holds the calls of its outputs
    cut = next((s for s in reversed(starts[1:]) if s in whole), starts[-1])
    used = nbytes = count = 0
    for k in range(len(starts) - 1, 0, -1):   # starts[0] keeps everything: that is no compaction
        end = starts[k + 1] if k + 1 < len(starts) else len(context)
        run = context[starts[k]:end]
        used, nbytes, count = used + cost(run), nbytes + sum(size(it) for it in run), count + len(run)
        if starts[k] < cut and (used > budget or nbytes > KEPT_BYTES or count > MAX_KEPT):
            break
        if starts[k] in whole:
            cut = min(cut, starts[k])
    older, kept = context[:cut], context[cut:]
    # what a compaction item cannot keep: the summary it replaces, and outputs whose call is not
    # kept with them (they are summarised instead)
    lost = {i for i in range(len(kept)) if kept[i]["type"] == SUMMARY_ITEM} | _orphans(kept)
    if lost:
        older, kept = [*older, *(kept[i] for i in sorted(lost))], [it for i, it in enumerate(kept) if i not in lost]
    nbytes = sum(size(it) for it in kept)
    if nbytes > KEPT_BYTES or len(kept) > MAX_KEPT:
        raise InvalidRequestError(
            f"This context cannot be compacted: its newest items, which a compaction keeps word for word for the "
            f"answer, take {nbytes / 2**20:.1f} MiB in {len(kept)} items, more than a compaction item holds "
            f"({KEPT_BYTES / 2**20:.1f} MiB, {MAX_KEPT} items; images count whole). Send fewer or smaller images "
            "in the latest turn.", param="input")
    return older, kept


def _whole(context: Items) -> set[int]:
    """The indices from which the rest of the context holds the call of every output in it."""
    unanswered: set[str] = set()   # outputs from here on whose call is not from here on
    out = set()
    for i in range(len(context) - 1, -1, -1):
        it = context[i]
        if it["type"] == "function_call_output":
            unanswered.add(it["call_id"])
        elif it["type"] == "function_call":
            unanswered.discard(it["call_id"])
        if not unanswered:
            out.add(i)
    return out


def _orphans(kept: Items) -> set[int]:
    """The indices of the outputs in ``kept`` whose call is not before them in it."""
    calls: set[str] = set()
    out = set()
    for i, it in enumerate(kept):
        if it["type"] == "function_call":
            calls.add(it["call_id"])
        elif it["type"] == "function_call_output" and it["call_id"] not in calls:
            out.add(i)
    return out


# the passes ----------------------------------------------------------------------------------
def _pass_job(text: TextService, plan: Plan, previous: str, part: str) -> Job:
    user = (f"Summary so far:\n{previous}\n\nThe conversation continues:\n{part}" if previous
            else f"The conversation:\n{part}")
    req = ChatCompletionRequest(model=plan.model, temperature=0, max_completion_tokens=plan.longest,
                                messages=[{"role": "system", "content": INSTRUCTIONS},
                                          {"role": "user", "content": user + "\n\nWrite the summary now."}])
    return chat.prepare(text, req, truncate=True)


async def summarize(text: TextService, plan: Plan) -> str:
    """Runs the passes in the caller's turn (the caller holds its place in line): each writes the
    summary of its part with the previous summary folded in."""
    summary = ""
    for part in plan.chunks:
        job = await text.tokenizer_work(_pass_job, text, plan, summary, part)
        # the one output parser, as for every answer: a reasoning model's thinking is no summary
        parser, written = OutputParser.for_job(job, incremental=False), []
        async with contextlib.aclosing(run_job(text, job, None)) as events:
            async for ev in events:
                if ev.delta is not None:
                    written += [e.text for e in parser.feed(ev.delta.text) if isinstance(e, Content)]
                if ev.result is not None:
                    written += [e.text for e in parser.feed("", final=True) if isinstance(e, Content)]
                    summary = "".join(written).strip() or summary
                    plan.spent[0] += job.prompt_tokens
                    plan.spent[1] += ev.result.tokens
    if plan.omitted:
        summary = f"[{plan.omitted} earliest items were left out.] {summary}"
    return summary



def standalone(host: Host, history: Items, new: Items, model: str | None,
               instructions: str | None) -> Plan:
    """The plan of POST /v1/responses/compact: the user messages that fit a quarter of the context kept."""
    if new and new[-1]["type"] == "compaction_trigger":
        raise InvalidRequestError("input ends with a compaction_trigger, which /v1/responses/compact does not "
                                  "need: it compacts what it is sent. Remove the item.", param=f"input[{len(new) - 1}]")
    context = expand([*history, *new])
    if not context:
        raise InvalidRequestError("There is nothing to compact: send input, or a previous_response_id.", param="input")
    older, kept = split(host, context, host.context_length() // 4, users_only=True, starts=[])
    return prepare(host, older, kept, model, instructions)
