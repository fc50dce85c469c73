"""One realtime response: the conversation through the text model and, for audio, through the
speech engine, as the server events of OpenAI's Realtime API.

The model is run through the text family's front door, as chat is (``admit`` with a chat request
built from the session's items, instructions and tools; ``run_job``), and its output is cut into
content and tool calls by the same parser (``OutputParser``). Audio streams by sentence: each
sentence goes to the speech engine as soon as the model has finished it, while the model goes
on, and its audio is sent as ``response.output_audio.delta`` events as soon as it is made.

Events, in OpenAI's order: ``response.created``; per output item ``response.output_item.added``,
``conversation.item.added``, ``response.content_part.added``, the deltas, their ``done``s,
``response.content_part.done``, ``response.output_item.done``, ``conversation.item.done``; and
``response.done`` with usage, whatever the ending (completed, incomplete at max_output_tokens,
cancelled, failed).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from pydantic import ValidationError

from ..audio.sentences import split_sentences
from ..core.errors import ContextLengthExceeded, OpenAIError, from_validation_errors, internal_error
from ..text import chat, fitting
from ..text.generation import run_job
from ..text.output import OutputParser
from ..text.protocol import ChatCompletionRequest
from ..text.service import TextService, admit
from ..text.tools import CallDelta, Content
from . import items as items_mod
from .audio import OutputEncoder
from .events import error_event, event, new_id
from .items import Conversation, public
from .service import RealtimeService
from .session import SessionConfig

log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
AUDIO_TOKENS_PER_SECOND = 20
DELTA_BYTES = 24_000 * 2 // 5       # audio deltas of at most 200 ms at 24 kHz
FIRST_CLAUSE_CHARS = 20             # the least of a first sentence spoken before the sentence ends
_CLAUSE = re.compile(r"[,;:—–]\s")


@dataclass
class Stages:
    """When each stage first produced something (perf_counter seconds), for the benchmark."""
    started: float = 0.0
    first_token: float | None = None
    first_sentence: float | None = None
    first_audio: float | None = None


@dataclass
class _Message:
    item: dict[str, Any]
    output_index: int
    audio: bool
    text: str = ""
    pending: str = ""                       # text not yet given to speech (an unfinished sentence)
    spoken: list[tuple[int, str]] = field(default_factory=list)   # (audio ms when it starts, sentence)


class Response:
    def __init__(self, service: RealtimeService, config: SessionConfig, conversation: Conversation | None,
                 send: Send, *, input_items: list[dict[str, Any]] | None = None, metadata: Any = None,
                 spoken: dict[str, list[tuple[int, str]]] | None = None, model: str | None = None):
        self.service = service
        self.model = model                   # the session's: a catalog model's name picks that model
        self.config = config
        self.conversation = conversation     # None: out of band, nothing added to the conversation
        self.input_items = input_items
        self.send = send
        self.id = new_id("resp")
        self.metadata = metadata
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.details: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.stages = Stages()
        self.encoder: OutputEncoder | None = None
        self.message: _Message | None = None
        # for each audio message, when each sentence's audio starts (conversation.item.truncate)
        self.spoken = spoken if spoken is not None else {}

    def snapshot(self) -> dict[str, Any]:
        c = self.config
        out: dict[str, Any] = {"id": self.id, "object": "realtime.response", "status": self.status,
                               "output": [public(i) for i in self.output],
                               "conversation_id": "conv_default" if self.conversation is not None else None,
                               "output_modalities": list(c.output_modalities),
                               "max_output_tokens": c.max_output_tokens,
                               "audio": {"output": {"format": {"type": c.output_format, **(
                                   {"rate": 24000} if c.output_format == "audio/pcm" else {})},
                                   "voice": c.voice}},
                               "metadata": self.metadata, "status_details": self.details, "usage": self.usage}
        return {k: v for k, v in out.items() if v is not None}

    async def _emit(self, type_: str, **fields: Any) -> None:
        await self.send(event(type_, **fields))

    # --- the run ------------------------------------------------------------------------------
    async def run(self, scope: anyio.CancelScope, reason: list[str],
                  before: Callable[[], Awaitable[None]] | None = None) -> None:
        """The whole response, ``response.created`` to ``response.done``. ``scope`` is cancelled
        by response.cancel or a barge-in; ``reason`` then holds why. ``before``: what to wait for
        before generating (the transcripts of the turns before it)."""
        self.stages.started = time.perf_counter()
        await self._emit("response.created", response=self.snapshot())
        prompt_tokens = text_tokens = 0
        try:
            with scope:
                if before is not None:
                    await before()
                prompt_tokens, text_tokens = await self._generate()
        except Exception as e:  # noqa: BLE001 - the response fails, the session goes on
            err = _single(e)
            if not isinstance(err, OpenAIError):
                log.exception("a realtime response failed")
                err = internal_error(err)
            self._fail(err)
            await self.send(error_event(err))
        finally:
            if self.encoder is not None:
                self.encoder.close()
        truncated = None
        if scope.cancel_called and self.status == "in_progress":
            self.status = "cancelled"
            self.details = {"type": "cancelled", "reason": reason[0] if reason else "client_cancelled"}
            truncated = self._cut_to_heard()
        await self._close_open_items()
        if truncated is not None and self.conversation is not None:
            await self._emit("conversation.item.truncated", item_id=truncated[0], content_index=0,
                             audio_end_ms=truncated[1])
        audio_s = (self.encoder.ms / 1000) if self.encoder is not None else 0.0
        audio_tokens = math.ceil(audio_s * AUDIO_TOKENS_PER_SECOND)
        self.usage = {"total_tokens": prompt_tokens + text_tokens + audio_tokens, "input_tokens": prompt_tokens,
                      "output_tokens": text_tokens + audio_tokens,
                      "input_token_details": {"text_tokens": prompt_tokens, "audio_tokens": 0, "cached_tokens": 0},
                      "output_token_details": {"text_tokens": text_tokens, "audio_tokens": audio_tokens}}
        if self.status == "in_progress":
            self.status = "completed"
        await self._emit("response.done", response=self.snapshot())
        st = self.stages
        log.debug("realtime response %s %s: first token %s, first sentence %s, first audio %s", self.id, self.status,
                  *(f"{t - st.started:.3f}s" if t is not None else "-"
                    for t in (st.first_token, st.first_sentence, st.first_audio)))

    def _cut_to_heard(self) -> tuple[str, int] | None:
        """A cancelled answer's transcript cut to what the user can have heard: the sentences whose
        audio was sent and, the client playing it as it came, had begun to play by now. The model's
        next turn then knows where it was interrupted. Returns (item id, audio end ms)."""
        m = self.message
        if m is None or not m.audio:
            return None
        sent_ms = self.encoder.ms if self.encoder is not None else 0
        played = 0 if self.stages.first_audio is None else int((time.perf_counter() - self.stages.first_audio) * 1000)
        end_ms = min(sent_ms, played)
        m.text = " ".join(sentence for start, sentence in m.spoken if start < end_ms)
        m.item["content"][0]["transcript"] = m.text
        return m.item["id"], end_ms

    def _fail(self, err: OpenAIError) -> None:
        self.status = "failed"
        self.details = {"type": "failed", "error": {"type": err.type, "code": err.code or "server_error"}}

    def _request(self, text: TextService) -> ChatCompletionRequest:
        c = self.config
        source = self.input_items if self.input_items is not None else \
            (self.conversation.items if self.conversation is not None else [])
        tools, choice = items_mod.chat_tools(c.tools, c.tool_choice)
        try:
            return ChatCompletionRequest(
                model=text.host.model_id, messages=items_mod.chat_messages(source, c.instructions), stream=True,
                tools=tools or None, tool_choice=choice if tools else None,
                parallel_tool_calls=False if tools else None,
                max_tokens=None if c.max_output_tokens == "inf" else c.max_output_tokens, temperature=c.temperature)
        except ValidationError as e:   # a tool's schema, say: the error names the chat field
            raise from_validation_errors([dict(x) for x in e.errors()]) from None

    async def _generate(self) -> tuple[int, int]:
        text = await self.service.text.lane(self.model)
        job, place = await admit(text, _prepare_within_context, text, self._request(text))
        parser = OutputParser.for_job(job)
        tokens = 0
        audio = "audio" in self.config.output_modalities
        sentences_out, sentences_in = anyio.create_memory_object_stream[tuple[_Message, str]](64)
        async with anyio.create_task_group() as tasks:
            if audio:
                tasks.start_soon(self._speak, sentences_in)
            else:
                sentences_in.close()
            async with sentences_out:
                async with contextlib.aclosing(run_job(text, job, place)) as generated:
                    async for ev in generated:
                        if ev.delta is not None:
                            if self.stages.first_token is None:
                                self.stages.first_token = time.perf_counter()
                            await self._take(parser.feed(ev.delta.text), sentences_out)
                        elif ev.result is not None:
                            await self._take(parser.feed("", final=True), sentences_out)
                            tokens = ev.result.tokens
                            if ev.result.finish_reason == "length":
                                self.status = "incomplete"
                                self.details = {"type": "incomplete", "reason": "max_output_tokens"}
                m = self.message
                if m is not None and m.audio and m.pending.strip():
                    await self._sentence(m, m.pending, sentences_out)
                    m.pending = ""
        return job.prompt_tokens, tokens

    async def _take(self, events: list[Any], sentences) -> None:
        for e in events:
            if isinstance(e, Content) and e.text:
                await self._content(e.text, sentences)
            elif isinstance(e, CallDelta):
                await self._call(e)

    # --- a message: text, or audio and its transcript ----------------------------------------
    async def _open_message(self) -> _Message:
        audio = "audio" in self.config.output_modalities
        item: dict[str, Any] = {"id": new_id("item"), "object": "realtime.item", "type": "message",
                                "status": "in_progress", "role": "assistant", "content": []}
        m = self.message = _Message(item, len(self.output), audio)
        if audio:
            self.spoken[item["id"]] = m.spoken
        await self._add_item(item)
        part = {"type": "audio", "transcript": ""} if audio else {"type": "text", "text": ""}
        await self._emit("response.content_part.added", **self._where(m), part=part)
        item["content"].append({"type": "output_audio", "transcript": ""} if audio else
                               {"type": "output_text", "text": ""})
        return m

    def _where(self, m: _Message) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": m.item["id"], "output_index": m.output_index, "content_index": 0}

    async def _content(self, piece: str, sentences) -> None:
        m = self.message or await self._open_message()
        if not m.text:
            piece = piece.lstrip()
            if not piece:
                return
        m.text += piece
        if not m.audio:
            m.item["content"][0]["text"] = m.text
            await self._emit("response.output_text.delta", **self._where(m), delta=piece)
            return
        m.item["content"][0]["transcript"] = m.text
        await self._emit("response.output_audio_transcript.delta", **self._where(m), delta=piece)
        m.pending += piece
        pieces = split_sentences(m.pending)
        if len(pieces) > 1:
            for sentence in pieces[:-1]:
                await self._sentence(m, sentence, sentences)
            # what follows the last finished sentence waits for the next delta
            m.pending = pieces[-1] + (" " if m.pending[-1:].isspace() else "")
        elif self.stages.first_sentence is None:
            # The first sentence may be spoken a clause at a time: the user hears the answer begin
            # while the model is still writing the rest of the sentence.
            cut = max((c.end() for c in _CLAUSE.finditer(m.pending)), default=0)
            if cut >= FIRST_CLAUSE_CHARS:
                await self._sentence(m, m.pending[:cut].strip(), sentences)
                m.pending = m.pending[cut:]

    async def _sentence(self, m: _Message, sentence: str, sentences) -> None:
        if self.stages.first_sentence is None:
            self.stages.first_sentence = time.perf_counter()
        await sentences.send((m, sentence))

    async def _speak(self, sentences: MemoryObjectReceiveStream[tuple[_Message, str]]) -> None:
        """Speech for each sentence as it comes, sent as audio deltas."""
        svc = self.service
        async with sentences:
            async for m, sentence in sentences:
                tts, voice = await svc.voice(self.config.voice)
                if self.encoder is None:
                    self.encoder = OutputEncoder(self.config.output_format)
                encoder = self.encoder
                start_ms = encoder.ms
                pcm, rate = await anyio.to_thread.run_sync(tts.speak, sentence, voice, self.config.speed,
                                                           limiter=svc.speech.turns)
                data = await anyio.to_thread.run_sync(encoder.write, pcm, rate)
                for at in range(0, len(data), DELTA_BYTES):
                    if self.stages.first_audio is None:
                        self.stages.first_audio = time.perf_counter()
                    await self._emit("response.output_audio.delta", **self._where(m),
                                     delta=base64.b64encode(data[at:at + DELTA_BYTES]).decode())
                    if at == 0:
                        m.spoken.append((start_ms, sentence))

    # --- a function call ----------------------------------------------------------------------
    async def _call(self, e: CallDelta) -> None:
        if e.id:
            await self._close_message()
            item = {"id": new_id("item"), "object": "realtime.item", "type": "function_call", "status": "in_progress",
                    "call_id": e.id, "name": e.name or "", "arguments": ""}
            await self._add_item(item)
        item = self.output[-1]
        if e.arguments:
            item["arguments"] += e.arguments
            await self._emit("response.function_call_arguments.delta", response_id=self.id, item_id=item["id"],
                             output_index=len(self.output) - 1, call_id=item["call_id"], delta=e.arguments)

    async def _add_item(self, item: dict[str, Any]) -> None:
        self.output.append(item)
        await self._emit("response.output_item.added", response_id=self.id, output_index=len(self.output) - 1,
                         item=public(item))
        if self.conversation is not None:   # an out-of-band response's items stay out of it
            previous = self.conversation.add(item)
            await self._emit("conversation.item.added", previous_item_id=previous, item=public(item))

    # --- endings ------------------------------------------------------------------------------
    async def _close_message(self) -> None:
        m, self.message = self.message, None
        if m is None:
            return
        where = self._where(m)
        if m.audio:
            await self._emit("response.output_audio.done", **where)
            await self._emit("response.output_audio_transcript.done", **where, transcript=m.text)
            part = {"type": "audio", "transcript": m.text}
        else:
            await self._emit("response.output_text.done", **where, text=m.text)
            part = {"type": "text", "text": m.text}
        await self._emit("response.content_part.done", **where, part=part)
        await self._finish_item(m.item, m.output_index)

    async def _finish_item(self, item: dict[str, Any], index: int) -> None:
        item["status"] = "completed" if self.status in ("in_progress", "completed") else "incomplete"
        await self._emit("response.output_item.done", response_id=self.id, output_index=index, item=public(item))
        if self.conversation is not None:
            await self._emit("conversation.item.done", previous_item_id=None, item=public(item))

    async def _close_open_items(self) -> None:
        await self._close_message()
        for index, item in enumerate(self.output):
            if item["type"] == "function_call" and item["status"] == "in_progress":
                item["arguments"] = items_mod.arguments_json(item["arguments"])
                await self._emit("response.function_call_arguments.done", response_id=self.id, item_id=item["id"],
                                 output_index=index, call_id=item["call_id"], name=item["name"],
                                 arguments=item["arguments"])
                await self._finish_item(item, index)


def _prepare_within_context(text: Any, req: ChatCompletionRequest) -> Any:
    """chat.prepare, with the oldest turns left out while the conversation does not fit the
    model's context (OpenAI's truncation "auto"): a long spoken session goes on, forgetting its
    start, instead of failing every answer. The instructions stay; what is kept starts at a user
    message, so no tool output is left without its call. Up to a quarter more of the turns kept is
    cut (text.fitting's slack), so the next turns fit with the same beginning, read from the cache.
    Tokens are cut (the truncate_prompt setting) only where even the newest turn does not fit."""
    system = [m for m in req.messages[:1] if m.role == "system"]
    rest = req.messages[len(system):]
    starts = [0, *(i for i, m in enumerate(rest) if i > 0 and m.role == "user")]

    def attempt(start: int, truncate: bool = False) -> tuple[int, Any]:
        kept = req.model_copy(update={"messages": system + rest[start:]}) if start else req
        return start, chat.prepare(text, kept, truncate=truncate)
    try:
        cut, job = fitting.fit(starts, attempt, slack=0.25)
    except ContextLengthExceeded:
        if not text.settings.truncate_prompt:
            raise
        cut, job = attempt(starts[-1], True)
    if cut:
        log.info("a realtime conversation was cut by %d of its oldest messages to fit the context", cut)
    return job


def _single(e: BaseException) -> BaseException:
    """The one error inside a task group's group of errors (the model's or the speech's)."""
    while len(getattr(e, "exceptions", ())) == 1:
        e = e.exceptions[0]   # type: ignore[attr-defined]
    return e
