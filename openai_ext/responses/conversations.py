"""The Conversations API: a conversation is a stored list of items that responses continue from
(``conversation`` on a response) and append their turns to.

Items are read and stored as a response's input items are (``items.parse``), so a conversation
lists them as OpenAI does: messages with ``input_text`` or ``output_text`` parts, function calls
and their outputs. Store work runs on the store's threads (``ResponsesService.io``); every
object is owned as in service.py.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..core.errors import InvalidRequestError
from . import answers, items
from .history import not_found
from .item_types import Items
from .protocol import AddItems, CreateConversation, UpdateConversation
from .service import ResponsesService


class Conversations:
    def __init__(self, responses: ResponsesService):
        self.responses = responses
        self.store = responses.store

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.responses.require_store()
        return await self.responses.io(fn, *args)

    def _parse(self, raw: list[dict[str, Any]], who: str | None, before: Items) -> Items:
        new = items.parse(raw, where="items", resolve=lambda item_id: self.store.item(item_id, who))
        if new and new[-1]["type"] == "compaction_trigger":
            raise InvalidRequestError(f"items[{len(new) - 1}] is a compaction_trigger, which only a response's input "
                                      "may end with; it is not kept in a conversation.",
                                      param=f"items[{len(new) - 1}].type")
        # items are kept as given: a call is answered when a response goes on from them
        answers.check_call_outputs(before, new, where="items", answered=False)
        return new

    async def create(self, body: CreateConversation, owner: str) -> dict[str, Any]:
        who = self.responses.visible_to(owner)
        conv = {"id": items.new_id("conv"), "object": "conversation", "created_at": int(time.time()),
                "metadata": body.metadata or {}}

        def work() -> None:
            new = self._parse(body.items or [], who, [])
            self.store.put_conversation(conv, owner, new)

        await self._call(work)
        return conv

    async def get(self, cid: str, owner: str) -> dict[str, Any]:
        conv = await self._call(self.store.conversation, cid, self.responses.visible_to(owner))
        if conv is None:
            raise not_found("Conversation", cid)
        return conv

    async def update(self, cid: str, body: UpdateConversation, owner: str) -> dict[str, Any]:
        conv = await self._call(self.store.set_metadata, cid, self.responses.visible_to(owner), body.metadata)
        if conv is None:
            raise not_found("Conversation", cid)
        return conv

    async def delete(self, cid: str, owner: str) -> dict[str, Any]:
        if not await self._call(self.store.delete_conversation, cid, self.responses.visible_to(owner)):
            raise not_found("Conversation", cid)
        return {"id": cid, "object": "conversation.deleted", "deleted": True}

    async def add_items(self, cid: str, body: AddItems, owner: str) -> dict[str, Any]:
        who = self.responses.visible_to(owner)

        def work() -> Items | None:
            before = self.store.conversation_items(cid, who)
            if before is None:
                return None
            new = self._parse(body.items, who, before)
            return new if self.store.add_conversation_items(cid, who, new) else None

        added = await self._call(work)
        if added is None:
            raise not_found("Conversation", cid)
        return {"object": "list", "data": added, "first_id": added[0]["id"], "last_id": added[-1]["id"],
                "has_more": False}

    async def list_items(self, cid: str, owner: str, *, after: str | None, limit: int, order: str) -> dict[str, Any]:
        found = await self._call(self.store.conversation_items, cid, self.responses.visible_to(owner))
        if found is None:
            raise not_found("Conversation", cid)
        return items.page(found, after=after, limit=limit, order=order)

    async def get_item(self, cid: str, item_id: str, owner: str) -> dict[str, Any]:
        found = await self._call(self.store.conversation_items, cid, self.responses.visible_to(owner))
        if found is None:
            raise not_found("Conversation", cid)
        item = next((it for it in reversed(found) if it["id"] == item_id), None)
        if item is None:
            raise not_found("Item", item_id)
        return item

    async def delete_item(self, cid: str, item_id: str, owner: str) -> dict[str, Any]:
        who = self.responses.visible_to(owner)
        conv = await self._call(self.store.conversation, cid, who)
        if conv is None:
            raise not_found("Conversation", cid)
        if not await self._call(self.store.delete_conversation_item, cid, item_id, who):
            raise not_found("Item", item_id)
        return conv
