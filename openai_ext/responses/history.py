"""What a Responses request reads from the store before it is prepared: the items before its
input (a previous response's or a conversation's) and the items its input refers to. It is read on
a store thread (``ResponsesService.io``), never while the prompt is prepared, and a request that
needs nothing from the store (``needs_store``) never calls it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

from ..core.config import Settings
from ..core.errors import InvalidRequestError, NotFoundError
from .item_types import Item, Items
from .protocol import CompactRequest, CreateResponse, InputTokensRequest
from .store import Store

Body = Union[CreateResponse, InputTokensRequest, CompactRequest]


def not_found(what: str, ident: str, param: str | None = None, code: str | None = None) -> NotFoundError:
    return NotFoundError(f"{what} with id '{ident}' not found.", param=param, code=code)


def previous_not_found(pid: str) -> NotFoundError:
    """The code OpenAI and Open Responses give it, which clients test for to start a new chain."""
    return not_found("Previous response", pid, "previous_response_id", "previous_response_not_found")


def check_conversation_id(cid: str, param: str) -> None:
    """A conversation id that could never be one is a 400, as at OpenAI (a well-formed unknown one
    is a 404)."""
    if not cid.startswith("conv"):
        raise InvalidRequestError(f"Invalid '{param}': '{cid[:64]}'. Expected an ID that begins with 'conv', such "
                                  "as 'conv_68f1a2b3c4d5e6f7' (the id of a conversation made with POST "
                                  "/v1/conversations).", param=param, code="invalid_conversation_id")


@dataclass
class Loaded:
    """What a request reads from the store before it is prepared: the items before its input (a
    previous response's or a conversation's), the conversation's id, and the items it refers to."""
    history: Items = field(default_factory=list)
    conversation: str | None = None
    references: dict[str, Item] = field(default_factory=dict)
    files: dict[tuple[int, str, int], str] = field(default_factory=dict)   # input_file parts' texts


def references(raw: Any) -> list[str]:
    """The ids of the item_reference items of an input (``{"type": "item_reference", "id"}``, or
    the shorthand ``{"id"}``); the items themselves are read in items.parse."""
    if not isinstance(raw, list):
        return []
    return [it["id"] for it in raw if isinstance(it, dict) and isinstance(it.get("id"), str)
            and (it.get("type") == "item_reference" or ("type" not in it and set(it) == {"id"}))]


def needs_store(body: Body, settings: Settings) -> bool:
    """Whether ``load`` would call the store for this request."""
    return settings.responses_store and (body.previous_response_id is not None or getattr(
        body, "conversation", None) is not None or bool(references(body.input)))


def check_chain(body: Body) -> None:
    if body.previous_response_id is not None and getattr(body, "conversation", None) is not None:
        raise InvalidRequestError("Send either conversation or previous_response_id, not both.",
                                  param="conversation")


# A WebSocket connection's memory of its own responses: id -> the items a continuation sees.
Recent = Callable[[str], "Items | None"]


def from_recent(body: Body, recent: Recent | None) -> tuple[Body, Items | None]:
    """The chain of a previous_response_id held in ``recent``, and the body to load the rest for
    (without that id: it is not read from the store, nor need it have been stored)."""
    pid = body.previous_response_id
    chain = recent(pid) if recent is not None and pid is not None else None
    if chain is None:
        return body, None
    check_chain(body)
    return body.model_copy(update={"previous_response_id": None}), chain


def load(store: Store, settings: Settings, body: Body, who: str | None) -> Loaded:
    """What the request reads from the store, on a store thread: the items before this input (a
    previous response's or a conversation's), the conversation id, and the referenced items.
    A request that needs nothing from the store never calls it."""
    check_chain(body)
    conversation = getattr(body, "conversation", None)   # /compact has none
    if not settings.responses_store:
        for param in ("previous_response_id", "conversation"):
            if getattr(body, param, None) is not None:
                raise InvalidRequestError(f"Nothing is stored on this server (the responses_store setting is "
                                          f"off), so {param} cannot be used; send the history as input items.",
                                          param=param, code="previous_response_not_found"
                                          if param == "previous_response_id" else "storage_disabled")
        return Loaded()
    loaded = Loaded()
    if body.previous_response_id is not None:
        pid = body.previous_response_id
        previous = store.response(pid, who)
        if previous is None:
            raise previous_not_found(pid)
        if previous["status"] in ("queued", "in_progress"):
            raise InvalidRequestError(f"Previous response '{pid}' is still {previous['status']}; continue from "
                                      "it once it has finished.", param="previous_response_id")
        loaded.history = store.history(pid, who)
    elif conversation is not None:
        cid = conversation if isinstance(conversation, str) else conversation.id
        check_conversation_id(cid, "conversation")
        found = store.conversation_items(cid, who)
        if found is None:
            raise not_found("Conversation", cid, "conversation")
        loaded.history, loaded.conversation = found, cid
    wanted = references(body.input)
    if wanted:
        loaded.references = store.items(wanted, who)
    return loaded

