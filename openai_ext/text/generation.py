"""Running generations: the bridge from the host's worker thread to the event loop.

``run_choice`` runs the host's blocking generator on the generation thread and hands its pieces
to the event loop through a bounded queue: a slow reader holds the generator back instead of
growing memory, and leaving the loop (client gone, stop string found) stops the host within a
token and waits until it has really stopped, so the request's place is given back only then.
``run_job`` runs every choice of a request: in turn, or, on a host that batches, up to
``HostAbilities.parallel`` of them at once (their deltas interleave; their ends come in order),
the choices beyond the first each in a place of the line taken while nobody waits there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Callable, overload

import anyio
import janus

from ..core.admission import Place
from ..core.errors import ContextLengthExceeded, OpenAIError, ServerError, ServiceUnavailableError
from ..hosts.base import Host, Piece, Prompt, TokenLogprob
from ..hosts.request import BACKGROUND, GenerationSettings
from .assembly import ChoiceAssembler, Delta
from .params import Plan
from .service import TextService

log = logging.getLogger(__name__)

# Runs a blocking call on the generation thread (TextService.run).
Runner = Callable[..., "asyncio.Future[Any]"]

# Pieces buffered between the generating thread and a client that reads slowly.
BUFFERED_PIECES = 64


_END = object()   # the host's generator is done


@dataclass
class _Failure:
    error: BaseException


async def host_pieces(host: Host, prompt: Prompt, settings: GenerationSettings,
                      run: Runner) -> AsyncGenerator[Piece, None]:
    """The host's pieces: read in the event loop where the host can (``Host.stream``), else
    generated on the generation thread. Leaving the iteration stops the host, and returns once
    it has stopped."""
    if BACKGROUND.get() and not settings.background:
        settings = settings.replace(background=True)
    stop_event = threading.Event()
    source = host.stream(prompt, settings, stop_event) or _threaded(host, prompt, settings, stop_event, run)
    try:
        async for piece in source:
            yield piece
    except OpenAIError:   # the host's own answer (a model change, say)
        raise
    except Exception as e:  # noqa: BLE001 - becomes the API's error object
        log.error("generation failed", exc_info=e)
        raise ServerError(f"The model failed while generating ({type(e).__name__}). "
                          "See the server log; retrying may help.") from None
    finally:
        stop_event.set()
        # Wait, even when cancelled, until the host has really stopped: the place in line is
        # given back only after this, so two generations never overlap.
        with anyio.CancelScope(shield=True):
            await source.aclose()


async def _threaded(host: Host, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event,
                    run: Runner) -> AsyncGenerator[Piece, None]:
    """``host.generate`` run on the generation thread, its pieces handed over a channel."""
    channel: janus.Queue[Any] = janus.Queue(maxsize=BUFFERED_PIECES)

    def work() -> None:
        try:
            with contextlib.closing(host.generate(prompt, settings, stop_event)) as pieces:
                for piece in pieces:
                    channel.sync_q.put(piece)
            channel.sync_q.put(_END)
        except janus.SyncQueueShutDown:
            pass  # the reader left; closing() above already stopped the host
        except BaseException as e:  # noqa: BLE001 - reported to the reader, which raises it
            with contextlib.suppress(janus.SyncQueueShutDown):
                channel.sync_q.put(_Failure(e))

    finished = run(work)
    try:
        while True:
            item = await channel.async_q.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop_event.set()
        channel.shutdown(immediate=True)
        with anyio.CancelScope(shield=True):
            await finished


@dataclass
class ChoiceResult:
    index: int
    text: str = ""
    finish_reason: str = "stop"
    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop: str | None = None     # the stop string that ended it (the request's or the template's)


async def run_choice(host: Host, prompt: Prompt, settings: GenerationSettings, stops: list[str], *,
                     want_logprobs: bool, result: ChoiceResult, run: Runner) -> AsyncGenerator[Delta, None]:
    """Generates one choice, yielding the deltas a client may see; fills ``result`` at the end."""
    asm = ChoiceAssembler(stops, want_logprobs=want_logprobs)
    host_reason: str | None = None
    if settings.max_new_tokens <= 0:
        host_reason = "length"
    else:
        async with contextlib.aclosing(host_pieces(host, prompt, settings, run)) as pieces:
            async for piece in pieces:
                delta = asm.feed(piece)
                if delta:
                    yield delta
                if asm.stopped:
                    break
                if piece.finish_reason:
                    host_reason = piece.finish_reason
                    break
    tail = asm.finish(host_reason)
    if tail:
        yield tail
    if not asm.tokens_known:
        # The host reported text, not tokens: count them with its tokenizer, on the generation
        # thread, where tokenizing a long answer does not hold up the event loop.
        asm.tokens = len(await run(functools.partial(host.tokenize, asm.text, add_bos=False))) \
            if asm.text else 0
    result.text, result.finish_reason, result.tokens = asm.text, asm.finish_reason or "stop", asm.tokens
    result.stop = asm.stop
    result.logprobs = asm.logprobs


# How a prompt too long for the context can be cut, here: a family whose requests say it
# themselves (the Responses API's truncation) words it its own way (core.errors.renamed). It comes
# after the real remedy, a longer context: cutting drops the prompt's start, which holds an
# agent's system prompt and tools.
TRUNCATE = {"remedy": "turn on the truncate_prompt setting, which cuts the oldest part of the prompt to fit "
                      "(a system prompt and tools first)"}
# ... and that remedy, said for where the context is set: the server's command line, or the web UI.
LONGER = "start the server with a longer context (--n-ctx N) or with a model that has one"
LONGER_WEB_UI = ("raise the context length in the web UI (ctx-size in the Model tab, then load the model again) "
                 "or load a model that has a longer context")
TOO_LONG = "To make room, {longer}. Otherwise shorten the {param}, or {remedy}."


def _words(host: Host) -> dict[str, str]:
    return {**TRUNCATE, "longer": LONGER_WEB_UI if host.abilities.web_ui else LONGER}


@overload
def bound_text(host: Host, text: str, *, truncate: bool, param: str) -> str: ...
@overload
def bound_text(host: Host, text: int, *, truncate: bool, param: str) -> None: ...
def bound_text(host: Host, text: str | int, *, truncate: bool, param: str) -> str | None:
    """Refuses text that cannot fit the context whatever its tokens, before it is rendered or
    tokenized: a token stands for at most ``host.max_token_bytes`` bytes and a character takes at
    least one, so this costs nothing and bounds the tokenizer's work by the context, not by the
    body. With truncate_prompt on, the text's start is cut instead (``text`` given as a string;
    fit_prompt() then cuts the exact tokens). ``text`` may be given as its length only."""
    ctx, per_token = host.context_length(), host.max_token_bytes
    limit = ctx * per_token
    length = text if isinstance(text, int) else len(text)
    if length <= limit:
        return None if isinstance(text, int) else text
    if truncate and isinstance(text, str):
        return text[-limit:]
    if truncate:
        return None
    raise ContextLengthExceeded(
        f"This model's maximum context length is {ctx} tokens, and there are {length} characters in the {{param}}: "
        f"more than {ctx} tokens of at most {per_token} bytes each can hold. " + TOO_LONG,
        param=param, words=_words(host))


def fit_prompt(host: Host, prompt: Prompt, *, requested: int | None, truncate: bool, param: str) -> Prompt:
    """Checks that the prompt leaves room for at least one token, or cuts its start if the
    truncate_prompt setting allows. ``requested`` is the client's max_tokens, if any."""
    ctx = host.context_length()
    if len(prompt.tokens) < ctx:
        return prompt
    if not truncate or prompt.images:   # (an image's tokens cannot be cut in part)
        raise ContextLengthExceeded(
            f"This model's maximum context length is {ctx} tokens, and {len(prompt.tokens)} tokens are taken by "
            "the {param} alone" + (f", {len(prompt.images)} image(s) included" if prompt.images else "") + ". "
            + TOO_LONG, param=param, words=_words(host))
    reserve = min(requested or max(1, ctx // 4), ctx // 2)
    kept = prompt.tokens[-(ctx - reserve):]
    log.warning("prompt cut from %d to %d tokens to fit the context of %d", len(prompt.tokens), len(kept), ctx)
    return Prompt(host.detokenize(kept), kept, prompt.stops, prompt.trim_start, prompt.images)


@dataclass
class Job:
    """One validated request, ready to run: its prompts (completions may send several), the
    plan from params.plan(), and what its responses are stamped with."""
    prompts: list[Prompt]
    plan: Plan
    model: str
    id: str
    created: int
    host: Host               # the host the prompts were tokenized for
    echo: list[str] = field(default_factory=list)
    tools: Any = None        # the ToolSet when the model may call functions (chat only)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.tokens) for p in self.prompts)

    def index(self, prompt_index: int, choice: int) -> int:
        return prompt_index * self.plan.n + choice


def new_job(prefix: str, prompts: list[Prompt], plan: Plan, host: Host) -> Job:
    return Job(prompts=prompts, plan=plan, model=host.model_id, id=f"{prefix}-{uuid.uuid4().hex[:24]}",
               created=int(time.time()), host=host)


@dataclass
class Event:
    """A delta of choice ``index`` (``delta`` set) or its end (``result`` set)."""
    index: int
    delta: Delta | None = None
    result: ChoiceResult | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


async def run_job(text: TextService, job: Job, place: Place | None) -> AsyncGenerator[Event, None]:
    """Runs every choice of the job, in the job's turn. ``place``: the job's place in line, to
    wait for and give back; None when the caller holds the turn already (a response's events,
    whose compaction passes and answer share one turn)."""
    plan, host = job.plan, job.host
    async with place if place is not None else contextlib.nullcontext():
        if text.host is not host:
            raise ServiceUnavailableError("The model was changed while this request waited; send it again.",
                                          code="model_changed")
        lanes = max(1, host.abilities.parallel)
        if lanes > 1 and len(job.prompts) * plan.best_of > 1:
            async with contextlib.aclosing(_together(text, job, lanes)) as events:
                async for event in events:
                    yield event
            return
        for p, prompt in enumerate(job.prompts):
            prompt_lp = None
            if plan.echo and plan.logprobs is not None:
                prompt_lp = await text.run(host.prompt_logprobs, prompt.tokens, plan.logprobs)
            for i in range(plan.best_of):
                index = p * plan.best_of + i  # candidates; equal to the choice index unless best_of > n
                result = ChoiceResult(index)
                if prompt_lp is not None:
                    yield Event(index, prompt_logprobs=prompt_lp)
                stops = plan.stops + [s for s in prompt.stops if s not in plan.stops]
                want_lp = plan.logprobs is not None or plan.best_of > plan.n
                async with contextlib.aclosing(run_choice(host, prompt, plan.settings_for_choice(i), stops,
                                                          want_logprobs=want_lp, result=result,
                                                          run=text.run)) as deltas:
                    async for delta in deltas:
                        yield Event(index, delta=delta)
                yield Event(index, result=result)


class _Lanes:
    """The lanes of a request whose choices run together: the one its own place in line gives,
    and more, each a place of its own taken from the line while one is free and nobody waits in
    it. A lane that frees while someone waits is given back to the line instead of being used
    again, so one request with many choices takes the whole batch only while no one else wants a
    turn, and a newcomer gets one at the next choice boundary."""

    def __init__(self, text: TextService, most: int):
        self.line = text.queue
        self.most = most
        self.extra: list[Place] = []
        self.busy = 0
        self.launched = False   # every choice has started: lanes that free are given back
        self.freed = asyncio.Event()

    async def _grow(self) -> bool:
        """Takes a free place from the line as one more lane, when nobody waits there. Such a
        place is handed over at once (the line has free room and no turns pending), so this
        never stands in line itself."""
        line = self.line
        if len(self.extra) + 1 >= self.most or line.waiting or line.running >= line.capacity:
            return False
        place = line.admit()
        await place.turn()
        self.extra.append(place)
        return True

    async def take(self) -> None:
        """Waits for a lane, and takes it."""
        while self.busy >= 1 + len(self.extra) and not await self._grow():
            self.freed.clear()
            await self.freed.wait()
        self.busy += 1

    def give(self) -> None:
        """A choice ended: its lane goes back to the line when someone waits there (or nothing
        is left to start), else to the next choice."""
        self.busy -= 1
        if self.extra and (self.line.waiting or self.launched):
            self.extra.pop().release()
        self.freed.set()

    def close(self) -> None:
        self.launched = True
        while self.extra:
            self.extra.pop().release()


async def _together(text: TextService, job: Job, lanes: int) -> AsyncGenerator[Event, None]:
    """The job's choices, up to ``lanes`` at once as sequences of the host's batch, the lanes
    beyond the first each holding a place in line (``_Lanes``). Each choice's events keep their
    order; its end (the result) comes after every earlier choice's end, so the results arrive in
    index order as they do one at a time."""
    plan, host = job.plan, job.host
    events: asyncio.Queue[Event | BaseException] = asyncio.Queue(maxsize=BUFFERED_PIECES)
    lane = _Lanes(text, lanes)
    tasks: list[asyncio.Task[None]] = []

    async def choice(index: int, prompt: Prompt, i: int, prompt_lp: list[TokenLogprob] | None) -> None:
        try:
            result = ChoiceResult(index)
            if prompt_lp is not None:
                await events.put(Event(index, prompt_logprobs=prompt_lp))
            stops = plan.stops + [s for s in prompt.stops if s not in plan.stops]
            want_lp = plan.logprobs is not None or plan.best_of > plan.n
            async with contextlib.aclosing(run_choice(host, prompt, plan.settings_for_choice(i), stops,
                                                      want_logprobs=want_lp, result=result, run=text.run)) as deltas:
                async for delta in deltas:
                    await events.put(Event(index, delta=delta))
            await events.put(Event(index, result=result))
        except Exception as e:  # noqa: BLE001 - handed to the reader, which raises it
            await events.put(e)
        finally:
            lane.give()

    async def launch() -> None:
        try:
            for p, prompt in enumerate(job.prompts):
                prompt_lp = None
                if plan.echo and plan.logprobs is not None:
                    prompt_lp = await text.run(host.prompt_logprobs, prompt.tokens, plan.logprobs)
                for i in range(plan.best_of):
                    await lane.take()
                    tasks.append(asyncio.create_task(choice(p * plan.best_of + i, prompt, i, prompt_lp)))
            lane.launched = True
        except Exception as e:  # noqa: BLE001
            await events.put(e)

    launcher = asyncio.create_task(launch())
    held: dict[int, Event] = {}
    next_end, total = 0, len(job.prompts) * plan.best_of
    try:
        while next_end < total:
            event = await events.get()
            if isinstance(event, BaseException):
                raise event
            if event.result is None:
                yield event
                continue
            held[event.index] = event
            while next_end in held:
                yield held.pop(next_end)
                next_end += 1
    finally:
        for task in [launcher, *tasks]:
            task.cancel()
        # Every choice stops its host and waits until it has (run_choice), even when cancelled.
        with anyio.CancelScope(shield=True):
            await asyncio.gather(launcher, *tasks, return_exceptions=True)
        lane.close()


def best_of(results: list[ChoiceResult], n: int) -> list[ChoiceResult]:
    """The n candidates with the highest log-probability per token, best first, as OpenAI
    ranks them. A total would favour short candidates; an empty one has nothing to score and
    comes last."""

    def score(r: ChoiceResult) -> float:
        return sum(e.logprob for e in r.logprobs) / len(r.logprobs) if r.logprobs else float("-inf")

    return sorted(results, key=score, reverse=True)[:n]
