"""The Responses family's work: a request from its validated body to its answer, and the stored
responses' routes (retrieve, delete, cancel, input items, input token counts).

``respond`` is the sibling of the text family's ``generate``: the same line (a place taken first,
so a full line is a 429 at once), the same one-at-a-time prepare on a worker thread, the same
generation (``run_job`` through ``stream.events``), then one of three ways out: a stream of
semantic events, a plain Response object, or (background) an answer at once while the response
runs on.

The store is never called on the event loop, nor while the prompt is prepared: what a request
reads from it (a previous response, a conversation, referenced items) is read first, on the
store's own threads (``io``), and the new response's row is written after. So a store that is slow
or down holds only the requests that need it, each for its deadline at most (store_health.py),
while chat and ``store: false`` responses are prepared and served as usual.

Ownership: with two different keys configured (api_key and admin_key), every stored object
belongs to the key that made it and is invisible (404) to the other; with one key or none, all
objects are shared. ``owner`` is a digest of the key, never the key.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse

from ..core.admission import Place
from ..core.config import Settings, SettingsError
from ..core.errors import InvalidRequestError
from ..core.streaming import event_stream, until_disconnect
from ..text.images import no_vision
from ..text.service import TextService, enter, serve
from . import answers, compaction, convert, file_search, framing, images, items, mcp, render, rules, stream, tools
from .background import Background
from .history import Loaded, Recent, from_recent, load, needs_store, not_found
from .input_files import Reader, file_texts, inlined
from .item_types import Items, SummaryItem
from .protocol import CompactRequest, CreateResponse, InputTokensRequest
from .store import Store
from .store_health import StoreUnavailable
from .turn import Record, Turn

log = logging.getLogger(__name__)

T = TypeVar("T")
STORE_THREADS = 16   # store calls at once; each ends within database_timeout


def default_folder() -> Path:
    """Standalone: the user's data folder (XDG), so stored responses outlive the project folder."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "openai_ext"


class ResponsesService:
    def __init__(self, settings: Settings, text: TextService):
        self.settings = settings
        self.text = text
        self.store = Store(settings.data_dir or default_folder(), max_stored=settings.responses_max_stored,
                           max_age_days=settings.responses_max_age_days, database_url=settings.database_url,
                           timeout=settings.database_timeout)
        if settings.database_url and settings.responses_store:
            # A shared database is opened at start: one it cannot use stops the server there, with
            # the reason, rather than failing every request later.
            try:
                self.store.open()
            except Exception as e:  # noqa: BLE001 - every cause ends the same way, told
                self.store.close()
                raise SettingsError(f"database_url ({self.store.what}): {e}") from None
        self.background = Background(text, self.store)
        # Two different keys: each key's objects are its own.
        self.private = bool(settings.api_key and settings.admin_key and settings.api_key != settings.admin_key)
        self._io: anyio.CapacityLimiter | None = None
        # file_search's search, the vector stores' (set where both families are built: state.py)
        self.searcher: file_search.Searcher | None = None
        self.file_reader: Reader | None = None   # input_file's file_id, read from the Files API

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking call to the store, on the store's own threads (never the event loop's, nor
        the prepare thread), so that a sick store can take no thread another family needs."""
        if self._io is None:
            self._io = anyio.CapacityLimiter(STORE_THREADS)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._io)

    def visible_to(self, owner: str) -> str | None:
        """The owner filter of the store's queries (None: every object is shared)."""
        return owner if self.private else None

    def require_store(self) -> None:
        if not self.settings.responses_store:
            raise InvalidRequestError("Nothing is stored on this server (the responses_store setting is off), so "
                                      "there are no stored responses or conversations.", code="storage_disabled")

    # preparing ---------------------------------------------------------------------------------
    async def load_async(self, body: CreateResponse | InputTokensRequest | CompactRequest, owner: str,
                         recent: Recent | None = None) -> Loaded:
        """What the request reads from the store (history.load), on a store thread; a request that
        needs nothing from the store never calls it. ``recent``: a WebSocket connection's memory of
        its own responses (id -> the items a continuation sees); a previous_response_id found there
        is not read from the store (nor need it have been stored)."""
        body, chain = from_recent(body, recent)
        who = self.visible_to(owner)
        if not needs_store(body, self.settings):
            loaded = load(self.store, self.settings, body, who)
        else:
            loaded = await self.io(load, self.store, self.settings, body, who)
        if chain is not None:
            loaded.history = chain
        loaded.files = await file_texts(body.input, owner, self.file_reader, self.text.host.context_length())
        return loaded

    def _items(self, text: TextService, body: CreateResponse | InputTokensRequest | CompactRequest,
               loaded: Loaded) -> Items:
        resolve = loaded.references.get if self.settings.responses_store else None
        abilities = text.host.abilities
        before = loaded.history
        new = items.parse(inlined(body.input, loaded.files), resolve=resolve,
                          vision=(abilities.vision, abilities.web_ui))
        answers.check_call_outputs(before, new)
        if not abilities.vision:
            # the images of an earlier turn, sent when a vision model was loaded
            shown = next((it for it in before if images.held(it)), None)
            if shown is not None:
                param = "previous_response_id" if body.previous_response_id is not None else "conversation"
                raise no_vision(param, abilities.web_ui, param=param,
                                what=f"continues from item '{shown.get('id')}', which holds an image")
        return new

    def prepare(self, text: TextService, body: CreateResponse, owner: str, loaded: Loaded,
                listing: mcp.Listing | None = None) -> Turn:
        """Everything before generation, on the prepare thread: every 400 and 404 happens here (or
        in ``load``). The store is not called here. ``text``: the lane of the model that serves it;
        ``listing``: the tools of the request's MCP servers (``mcp.list_servers``)."""
        store = rules.body_stores(body, self.settings)
        history, cid = loaded.history, loaded.conversation
        new = self._items(text, body, loaded)
        answers.check_approvals(history, new)
        forced = bool(new) and new[-1]["type"] == "compaction_trigger"
        new = new[:-1] if forced else new
        tool_map = tools.build(body.tools, listing)
        manage = compaction.managed(body.context_management)
        plan = None
        if manage is not None or forced:
            job, plan = self._compacting(text, body, history, new, tool_map, manage, forced=forced)
        else:
            job = convert.prepare(text, body, history, new, tools=tool_map)
        background = bool(body.background)
        state = render.ResponseState(id=items.new_id("resp"), model=job.model, background=background,
                                     echo=render.echo(body, store=store, conversation_id=cid),
                                     status="queued" if background else "in_progress")
        turn = Turn(job, state, text, stream=bool(body.stream), max_tool_calls=body.max_tool_calls,
                    want_logprobs=job.plan.logprobs is not None, tools=tool_map,
                    record=Record(owner, cid, new, store),
                    compaction=plan, answer=not forced, before=history)
        if plan is not None:
            turn.rebuild = lambda compacted: convert.prepare(text, body, [], compacted, tools=tool_map)
        context = [*history, *new]
        mcp.check_servers(listing, context)
        limit = min(self.settings.mcp_max_calls, body.max_tool_calls or self.settings.mcp_max_calls)
        searching = file_search.attach(turn, body, owner, self.searcher, limit)
        if listing is not None:
            turn.servers = mcp.Servers(self.settings, listing, context, limit)
        if listing is not None or searching:
            turn.tool_choice, turn.max_output_tokens = body.tool_choice, body.max_output_tokens
            turn.again = lambda produced, update: convert.again(
                text, body, (history, new) if turn.compacted is None else ([], turn.compacted), produced, update,
                tools=tool_map)
        if store or cid:
            turn.settle_work = self._settle
        return turn

    def _compacting(self, text: TextService, body: CreateResponse, history: Items, new: Items,
                    tool_map: tools.ToolMap, manage: compaction.Managed | None, *,
                    forced: bool) -> tuple[Any, compaction.Plan | None]:
        """The job, and the compaction to run first when the prompt passes the threshold (or the
        input ends with a compaction_trigger). The job is made from what will be kept, so a
        context that cannot fit even so is a 400 now, not after the summary is written."""
        host = text.host
        bound = compaction.limit(host.context_length(), body.max_output_tokens, manage)
        if not forced:
            try:
                job = convert.prepare(text, body, history, new, tools=tool_map)
                if job.prompt_tokens <= bound:
                    return job, None
            except InvalidRequestError as e:
                if e.code != "context_length_exceeded":
                    raise
        context = compaction.expand([*history, *new])
        if not context:
            raise InvalidRequestError("There is nothing to compact: send input, or continue a conversation or a "
                                      "previous response.", param="input")
        older, kept = compaction.split(host, context, bound // 2, users_only=False, starts=convert.starts(context))
        if not older and not forced:   # one run of items that cannot be split: nothing to summarise
            return convert.prepare(text, body, history, new, tools=tool_map), None
        placeholder: Items = [SummaryItem(type=compaction.SUMMARY_ITEM, text=""), *kept]
        job = convert.prepare(text, body, [], placeholder, tools=tool_map)
        return job, compaction.prepare(host, older, kept, body.model)

    def _settle(self, turn: Turn) -> None:
        """Stores a response as it ended, and appends a finished turn to its conversation. A store
        that fails raises its StoreUnavailable, and the response is then failed (``_lost``)."""
        body = turn.state.snapshot()
        output = copy.deepcopy(turn.state.output)   # as a chain shows it to the model: search results kept
        record = turn.record
        assert record is not None   # (set with settle_work)
        cid = record.conversation
        conversation = None
        if cid and body["status"] in ("completed", "incomplete"):
            conversation = (cid, [*record.input, *output])
        try:
            if record.store:
                self.store.settle(body, conversation, lambda e: self._lost(turn, e), output=output)
            elif conversation is not None:
                try:
                    self.store.add_conversation_items(conversation[0], None, conversation[1])
                except StoreUnavailable as e:
                    self._lost(turn, e)
                    raise
        except RuntimeError:
            log.warning("response %s ended after the store was closed; it is not kept", body["id"])

    @staticmethod
    def _lost(turn: Turn, error: StoreUnavailable) -> dict[str, Any]:
        """A response whose end could not be stored is failed, as the client is then told, and its
        body as it is owed to the store."""
        state = turn.state
        if state.status not in ("failed", "cancelled"):
            state.finish("failed", error={"code": "server_error", "message": f"This response could not be stored: "
                                                                           f"{error.message}"})
        return state.snapshot()

    # answering ---------------------------------------------------------------------------------
    async def begin(self, body: CreateResponse, owner: str, recent: Recent | None = None) -> tuple[Turn, Place]:
        """A place in line (a full line is a 429 at once, before any work), what the request reads
        from the store (or a WebSocket's ``recent`` memory), the prepared turn, and its row written
        when it is stored; the caller runs the turn through ``stream.events`` and gives the place back."""
        text = await self.text.lane(body.model, body.keep_alive)
        place = enter(text)
        try:
            rules.check(body, self.settings)
            loaded = await self.load_async(body, owner, recent)
            # outbound: checked against mcp_allow, then listed (or the lists the context holds)
            listing = await mcp.list_servers(self.settings, body.tools, [*loaded.history, *body.input_list])
            await file_search.check(body.tools, owner, self.searcher)   # its stores exist and are the caller's
            turn = await text.prepared(self.prepare, text, body, owner, loaded, listing)
            record = turn.record
            if record is not None and record.store:
                rid = turn.state.id
                self.store.claim(rid)   # before its row exists: this instance's sweep never fails it
                try:
                    await self.io(self.store.put_response, turn.state.snapshot(), owner, record.input)
                except BaseException:
                    self.store.release(rid)
                    raise
        except BaseException:
            place.release()
            raise
        return turn, place

    async def respond(self, request: Request, body: CreateResponse, owner: str) -> Any:
        turn, place = await self.begin(body, owner)
        text = turn.text
        timeout = self.settings.stream_send_timeout
        if turn.state.background:
            run = self.background.start(turn, place)
            if turn.stream:
                # The client may leave: the response runs on, and can be followed again with GET.
                return event_stream(run.follow(), send_timeout=timeout, framing=framing.Framing(turn))
            return JSONResponse(turn.state.snapshot())
        def closed() -> None:
            if not turn.settled:   # the client left before the stream began
                turn.settle_soon()
        return await serve(text, request, place, events=stream.events(text, turn, place) if turn.stream else None,
                           answer=lambda: stream.complete(text, turn, place), framing=framing.Framing(turn),
                           on_close=closed)

    # compaction ----------------------------------------------------------------------------------
    def _compaction_plan(self, text: TextService, body: CompactRequest, loaded: Loaded) -> compaction.Plan:
        return compaction.standalone(text.host, loaded.history, self._items(text, body, loaded), body.model,
                                     body.instructions)

    async def compact(self, request: Request, body: CompactRequest, owner: str) -> dict[str, Any]:
        """POST /v1/responses/compact: the user messages that fit a quarter of the context, then
        one compaction item standing for the whole window; nothing is stored."""
        text = await self.text.lane(body.model, body.keep_alive)
        place = enter(text)
        try:
            loaded = await self.load_async(body, owner)
            plan = await text.prepared(self._compaction_plan, text, body, loaded)
        except BaseException:
            place.release()
            raise
        try:
            async def run() -> str:
                async with place:
                    return await compaction.summarize(text, plan)

            summary = await until_disconnect(request, run())
        finally:
            place.release()
        shown = [dict(it, status="completed") for it in plan.kept]
        return {"id": items.new_id("resp"), "object": "response.compaction", "created_at": int(time.time()),
                "output": [*shown, compaction.item(summary, plan.kept)], "usage": render.usage(*plan.spent)}

    # stored responses --------------------------------------------------------------------------
    def _live(self, response_id: str, owner: str) -> Any:
        run = self.background.get(response_id)
        if run is None or (self.private and (run.turn.record is None or run.turn.record.owner != owner)):
            return None
        return run

    async def retrieve(self, response_id: str, owner: str, *, stream_: bool = False,
                       starting_after: int | None = None) -> Any:
        self.require_store()
        run = self._live(response_id, owner)
        body = run.snapshot() if run else await self.io(
            self.store.response, response_id, self.visible_to(owner))
        if body is None:
            raise not_found("Response", response_id)
        if not stream_:
            return body
        if not body.get("background"):
            raise InvalidRequestError("Only background responses can be streamed again; retrieve this one without "
                                      "stream.", param="stream")
        after = -1 if starting_after is None else starting_after
        if run is None and body["status"] in ("queued", "in_progress"):
            # another server sharing the store runs it: its events are there until it ends
            raise InvalidRequestError(f"Response '{response_id}' runs on another server sharing this store; stream it "
                                      "from that server, or retrieve it without stream (its events can be streamed "
                                      "from any server once it has ended).", param="stream")
        if run is not None:
            return event_stream(run.follow(after), send_timeout=self.settings.stream_send_timeout,
                                framing=framing.Framing(run.turn))
        events = await self.io(self.store.events, response_id)
        return event_stream(framing.replay([e for e in events if e["sequence_number"] > after]),
                            send_timeout=self.settings.stream_send_timeout, framing=framing.Framing(None))

    async def delete(self, response_id: str, owner: str) -> dict[str, Any]:
        self.require_store()
        if self._live(response_id, owner) is not None:
            await self.background.cancel(response_id)
        if not await self.io(self.store.delete_response, response_id, self.visible_to(owner)):
            raise not_found("Response", response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def cancel(self, response_id: str, owner: str) -> dict[str, Any]:
        self.require_store()
        if self._live(response_id, owner) is not None:
            stopped = await self.background.cancel(response_id)
            if stopped is not None:
                return stopped
        body = await self.io(self.store.response, response_id, self.visible_to(owner))
        if body is None:
            raise not_found("Response", response_id)
        if not body.get("background"):
            # OpenAI's words, which clients match on
            raise InvalidRequestError("Cannot cancel a synchronous response.", param="response_id")
        if body["status"] in ("queued", "in_progress"):
            stopped = await self.background.cancel_elsewhere(response_id, self.visible_to(owner))
            if stopped is None:
                raise not_found("Response", response_id)
            return stopped
        return body   # it had ended already: cancelling again changes nothing, as at OpenAI

    async def input_items(self, response_id: str, owner: str, *, after: str | None, limit: int,
                          order: str) -> dict[str, Any]:
        self.require_store()
        found = await self.io(self.store.input_items, response_id, self.visible_to(owner))
        if found is None:
            raise not_found("Response", response_id)
        return items.page(found, after=after, limit=limit, order=order)

    async def input_tokens(self, body: InputTokensRequest, owner: str) -> dict[str, Any]:
        """Tokens of the prompt this input would be rendered into, instructions and tools included."""
        text = await self.text.lane(body.model, body.keep_alive)
        text.require_model()
        loaded = await self.load_async(body, owner)

        def count() -> int:
            new = self._items(text, body, loaded)
            job = convert.prepare(text, body, loaded.history, new)
            return job.prompt_tokens

        tokens = await text.tokenizer_work(count)
        return {"object": "response.input_tokens", "input_tokens": tokens}

    def close(self) -> None:
        self.background.close()
        self.store.close()
