"""One realtime session on its WebSocket: the client's events read one after another, the
server's sent one frame at a time, and the work (transcriptions, responses) run beside the
reading, so that audio keeps arriving while the model answers.

Input audio is turned into 16 kHz samples as it is appended. With server_vad, the detector
marks speech start and stop as it goes: a stop commits the buffer and, when the session asks,
creates the response; speech while a response runs cancels it (barge-in). With turn_detection
null the client commits, and creates responses, itself (push-to-talk).

A committed turn is transcribed at once; a response waits for the transcripts of the turns
before it, then runs (respond.py). One response runs at a time, as at OpenAI.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import anyio
from anyio.abc import TaskGroup
from fastapi import WebSocket

from ..core.api_model import allowed
from ..core.errors import InvalidRequestError, OpenAIError, internal_error
from . import session as session_mod
from .audio import StreamingVad
from .buffer import MIN_COMMIT_MS, InputBuffer, decode_b64, to_16k
from .buffer import RATE as WHISPER_RATE
from .events import ClientEventError, error_event, event, new_id, parse
from .items import Conversation, client_item, public
from .respond import Response
from .service import RealtimeService

log = logging.getLogger(__name__)

KEPT_BEFORE_SPEECH_MS = 1000


class Session:
    def __init__(self, socket: WebSocket, service: RealtimeService, model: str,
                 config: session_mod.SessionConfig | None = None):
        self.socket = socket
        self.service = service
        settings = service.settings
        self.id = new_id("sess")
        self.model = model
        self.expires_at = int(time.time() + settings.realtime_max_session_s)
        self.config = config or session_mod.SessionConfig()   # (a client secret's, where one let it in)
        self.conversation = Conversation()
        self.frame_limit = settings.realtime_max_frame_kb * 1024
        self.sending = anyio.Lock()
        self.tasks: TaskGroup | None = None
        self.buffer = InputBuffer(settings.realtime_max_buffer_s)
        self.vad: StreamingVad | None = None
        self.speech_item: str | None = None
        # transcripts on their way, by item id; the response in progress
        self.transcribing: dict[str, anyio.Event] = {}
        self.response: Response | None = None
        self.response_scope: anyio.CancelScope | None = None
        self.cancel_reason: list[str] = []
        self.response_done = anyio.Event()
        self.response_done.set()
        self.last_response: Response | None = None
        self.spoken: dict[str, list[tuple[int, str]]] = {}

    # --- the loop -----------------------------------------------------------------------------
    async def run(self) -> None:
        await self.send(event("session.created", session=self._describe()))
        with anyio.move_on_after(self.service.settings.realtime_max_session_s) as deadline:
            async with anyio.create_task_group() as tasks:
                self.tasks = tasks
                while True:
                    message = await self.socket.receive()
                    if message["type"] == "websocket.disconnect":
                        tasks.cancel_scope.cancel()
                        return
                    await self._take(message)
        if deadline.cancelled_caught:
            minutes = self.service.settings.realtime_max_session_s / 60
            await self.send(error_event(InvalidRequestError(
                f"This session reached its maximum length of {minutes:g} minutes (the realtime_max_session_s "
                "setting). Open a new session to go on.", code="session_expired")))
            with contextlib.suppress(Exception):   # the client may have gone meanwhile
                await self.socket.close(code=1000, reason="session expired")

    async def send(self, ev: dict[str, Any]) -> None:
        """One frame. A client that reads nothing for stream_send_timeout seconds is dropped."""
        try:
            with anyio.fail_after(self.service.settings.stream_send_timeout):
                async with self.sending:
                    await self.socket.send_json(ev)
        except Exception:  # noqa: BLE001 - any failure to send means the client is gone
            if self.tasks is not None:
                self.tasks.cancel_scope.cancel()
            await anyio.lowlevel.checkpoint()

    async def _take(self, message: Any) -> None:
        raw = message.get("text")
        if raw is None:
            raw = message.get("bytes") or b""
        event_id = None
        try:
            doc = parse(raw, self.frame_limit)
            event_id = doc.get("event_id")
            await getattr(self, "_on_" + doc["type"].replace(".", "_"))(doc)
        except ClientEventError as e:
            await self.send(error_event(e, e.event_id or event_id))
        except OpenAIError as e:
            await self.send(error_event(e, event_id))
        except Exception as e:  # noqa: BLE001 - the client hears of it, the session goes on
            log.exception("a realtime event failed")
            await self.send(error_event(internal_error(e), event_id))

    def _describe(self) -> dict[str, Any]:
        return session_mod.describe(self.config, session_id=self.id, model=self.model, expires_at=self.expires_at)

    # --- session ------------------------------------------------------------------------------
    async def _on_session_update(self, doc: dict[str, Any]) -> None:
        before = self.config.turn_detection
        self.config = session_mod.update(self.config, doc.get("session"), self.service.check_voice,
                                         allow_unknown=allowed())
        if self.config.turn_detection != before:
            self.vad = None     # made again with the new settings at the next append
            self.speech_item = None
        await self.send(event("session.updated", session=self._describe()))

    # --- input audio ----------------------------------------------------------------------------
    async def _on_input_audio_buffer_append(self, doc: dict[str, Any]) -> None:
        audio = doc.get("audio")
        if not isinstance(audio, str):
            raise ClientEventError("'audio' is required: base64 of the audio in the session's input format.",
                                   param="audio", code="missing_required_parameter")
        samples = self.buffer.append(decode_b64(audio, "audio"), self.config.input_format)
        vad = self.config.vad
        if vad is None:
            return
        if self.vad is None:
            self.vad = StreamingVad(vad)
            self.vad.done = self.buffer.heard - samples.size
        for mark, ms in await anyio.to_thread.run_sync(self.vad.feed, samples):
            await self._vad_mark(mark, ms)
        if not self.vad.speaking:
            # before speech, only the prefix padding (and a little more) is worth keeping
            self.buffer.drop_before(self.buffer.now_ms - vad.prefix_padding_ms - KEPT_BEFORE_SPEECH_MS)

    async def _vad_mark(self, mark: str, ms: int) -> None:
        td = self.config.turn_detection or {}
        if mark == "started":
            self.speech_item = new_id("item")
            await self.send(event("input_audio_buffer.speech_started", audio_start_ms=ms, item_id=self.speech_item))
            if self.response is not None and td.get("interrupt_response", True):
                self._cancel_response("turn_detected")
            # the buffer keeps only the prefix padding before speech
            self.buffer.drop_before(ms)
            return
        item_id = self.speech_item or new_id("item")
        self.speech_item = None
        await self.send(event("input_audio_buffer.speech_stopped", audio_end_ms=ms, item_id=item_id))
        await self._commit(None, item_id)
        if not td.get("create_response", True):
            return
        if self.response is None:
            await self._start_response(None)
        elif self.cancel_reason:
            # the answer this turn interrupted is still stopping: this turn's answer follows it
            assert self.tasks is not None
            self.tasks.start_soon(self._respond_after, self.response_done)

    async def _respond_after(self, done: anyio.Event) -> None:
        await done.wait()
        if self.response is None:
            try:
                await self._start_response(None)
            except OpenAIError as e:
                await self.send(error_event(e))

    async def _on_input_audio_buffer_commit(self, doc: dict[str, Any]) -> None:
        await self._commit(doc.get("event_id"), new_id("item"))

    async def _commit(self, event_id: str | None, item_id: str) -> None:
        audio = self.buffer.take(event_id)
        item = {"id": item_id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
                "content": [{"type": "input_audio"}]}
        previous = self.conversation.add(item)
        await self.send(event("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id))
        await self.send(event("conversation.item.added", previous_item_id=previous, item=public(item)))
        done = self.transcribing[item_id] = anyio.Event()
        assert self.tasks is not None
        self.tasks.start_soon(self._transcribe, item, audio, previous, done)

    async def _transcribe(self, item: dict[str, Any], audio: Any, previous: str | None, done: anyio.Event,
                          index: int = 0) -> None:
        part = item["content"][index]
        reported = self.config.transcription is not None

        async def delta(piece: str) -> None:
            if reported:
                await self.send(event("conversation.item.input_audio_transcription.delta", item_id=item["id"],
                                      content_index=index, delta=piece))
        try:
            transcript = await self.service.transcribe(audio, self.config.transcription, delta)
            part["transcript"] = transcript
            if reported:
                await self.send(event("conversation.item.input_audio_transcription.completed", item_id=item["id"],
                                      content_index=index, transcript=transcript,
                                      usage={"type": "duration", "seconds": round(audio.size / WHISPER_RATE, 3)}))
        except Exception as e:  # noqa: BLE001 - the turn has no transcript; the session goes on
            err = e if isinstance(e, OpenAIError) else internal_error(e)
            if not isinstance(e, OpenAIError):
                log.exception("transcribing a realtime turn failed")
            part["transcript"] = ""
            await self.send(event("conversation.item.input_audio_transcription.failed", item_id=item["id"],
                                  content_index=index, error={"type": err.type, "code": err.code or "",
                                                          "message": err.message, "param": err.param or ""}))
        finally:
            done.set()
            self.transcribing = {k: v for k, v in self.transcribing.items() if v is not done}
        await self.send(event("conversation.item.done", previous_item_id=previous, item=public(item)))

    async def _on_input_audio_buffer_clear(self, doc: dict[str, Any]) -> None:
        self.buffer.clear()
        self.speech_item = None
        if self.vad is not None:
            self.vad = None
        await self.send(event("input_audio_buffer.cleared"))

    async def _on_output_audio_buffer_clear(self, doc: dict[str, Any]) -> None:
        # Over a WebSocket the client plays the audio itself: there is no buffer here to clear;
        # a response still speaking is cancelled, as OpenAI's WebRTC sessions do.
        if self.response is not None:
            self._cancel_response("client_cancelled")
        await self.send(event("output_audio_buffer.cleared", response_id=self.last_response.id
                              if self.last_response else ""))

    # --- conversation items -----------------------------------------------------------------------
    async def _on_conversation_item_create(self, doc: dict[str, Any]) -> None:
        item = client_item(doc.get("item"))
        if self.conversation.find(item["id"]) is not None:
            raise ClientEventError(f"An item with id {item['id']!r} is already in the conversation.",
                                   param="item.id", code="item_already_exists")
        heard = [(k, self._item_audio(part.pop("audio"), f"item.content[{k}].audio"))
                 for k, part in enumerate(item.get("content", ())) if "audio" in part]
        previous = doc.get("previous_item_id")
        previous = self.conversation.add(item, previous if isinstance(previous, str) else None)
        await self.send(event("conversation.item.added", previous_item_id=previous, item=public(item)))
        if not heard:
            await self.send(event("conversation.item.done", previous_item_id=previous, item=public(item)))
        for index, audio in heard:    # audio parts are transcribed as a committed turn is
            done = self.transcribing[f"{item['id']}/{index}"] = anyio.Event()
            assert self.tasks is not None
            self.tasks.start_soon(self._transcribe, item, audio, previous, done, index)

    def _item_audio(self, data: str, param: str) -> Any:
        audio = to_16k(decode_b64(data, param), self.config.input_format)
        if audio.size * 1000 < MIN_COMMIT_MS * WHISPER_RATE:
            raise ClientEventError(f"'{param}' holds less than {MIN_COMMIT_MS} ms of audio.", param=param)
        return audio

    def _item(self, doc: dict[str, Any]) -> dict[str, Any]:
        item_id = doc.get("item_id")
        item = self.conversation.find(item_id) if isinstance(item_id, str) else None
        if item is None:
            raise ClientEventError(f"Item {item_id!r} is not in the conversation.", param="item_id",
                                   code="item_not_found")
        return item

    async def _on_conversation_item_retrieve(self, doc: dict[str, Any]) -> None:
        await self.send(event("conversation.item.retrieved", item=public(self._item(doc))))

    async def _on_conversation_item_delete(self, doc: dict[str, Any]) -> None:
        item = self._item(doc)
        self.conversation.delete(item["id"])
        await self.send(event("conversation.item.deleted", item_id=item["id"]))

    async def _on_conversation_item_truncate(self, doc: dict[str, Any]) -> None:
        """The assistant's audio cut at ``audio_end_ms``, as played: the transcript keeps the
        sentences whose audio had started by then, so the model knows what was heard."""
        item = self._item(doc)
        end = doc.get("audio_end_ms")
        if not isinstance(end, int) or isinstance(end, bool) or end < 0:
            raise ClientEventError("'audio_end_ms' must be a whole number of milliseconds, 0 or more.",
                                   param="audio_end_ms")
        if item["type"] != "message" or item["role"] != "assistant" or not item["content"] or \
                item["content"][0].get("type") != "output_audio":
            raise ClientEventError("Only an assistant message with audio can be truncated.", param="item_id")
        spoken = self.spoken.get(item["id"], [])
        heard = [sentence for start, sentence in spoken if start < end]
        item["content"][0]["transcript"] = " ".join(heard)
        item["status"] = "incomplete"
        await self.send(event("conversation.item.truncated", item_id=item["id"], content_index=0,
                              audio_end_ms=end))

    # --- responses ----------------------------------------------------------------------------
    async def _on_response_create(self, doc: dict[str, Any]) -> None:
        await self._start_response(doc)

    async def _start_response(self, doc: dict[str, Any] | None) -> None:
        event_id = doc.get("event_id") if doc else None
        if self.response is not None:
            raise ClientEventError(f"Conversation already has an active response in progress: "
                                   f"{self.response.id}. Wait until the response is finished before creating a "
                                   "new one (or send response.cancel).", event_id=event_id,
                                   code="conversation_already_has_active_response")
        spec = (doc or {}).get("response")
        config = session_mod.response_config(self.config, spec)
        if config.voice != self.config.voice:
            self.service.check_voice(config.voice)
        spec = spec or {}
        band = spec.get("conversation", "auto")
        if band not in ("auto", "none"):
            raise ClientEventError("'response.conversation' must be \"auto\" or \"none\".",
                                   param="response.conversation", event_id=event_id)
        input_items = None
        if spec.get("input") is not None:
            if not isinstance(spec["input"], list):
                raise ClientEventError("'response.input' must be a list of items.", param="response.input",
                                       event_id=event_id)
            input_items = []
            for raw in spec["input"]:
                if isinstance(raw, dict) and raw.get("type") == "item_reference":
                    found = self._item({"item_id": raw.get("id")})
                    input_items.append(found)
                else:
                    input_items.append(client_item(raw))
        response = Response(self.service, config, self.conversation if band == "auto" else None, self.send,
                            input_items=input_items, metadata=spec.get("metadata"), spoken=self.spoken,
                            model=self.model)
        self.response = self.last_response = response
        self.response_scope = anyio.CancelScope()
        self.cancel_reason = []
        self.response_done = anyio.Event()
        assert self.tasks is not None
        self.tasks.start_soon(self._respond, response, self.response_scope)

    async def _respond(self, response: Response, scope: anyio.CancelScope) -> None:
        waiting = list(self.transcribing.values())

        async def transcripts() -> None:
            for done in waiting:
                await done.wait()

        try:
            await response.run(scope, self.cancel_reason, transcripts)
        finally:
            if self.response is response:
                self.response = None
            self.response_done.set()

    def _cancel_response(self, reason: str) -> None:
        if self.response_scope is not None:
            self.cancel_reason[:] = [reason]
            self.response_scope.cancel()

    async def _on_response_cancel(self, doc: dict[str, Any]) -> None:
        wanted = doc.get("response_id")
        if self.response is None or (isinstance(wanted, str) and wanted != self.response.id):
            raise ClientEventError("There is no response in progress to cancel" +
                                   (f" with id {wanted!r}." if wanted else "."), event_id=doc.get("event_id"),
                                   code="response_cancel_not_active")
        self._cancel_response("client_cancelled")
