"""GET /v1/models: the models this server really has loaded, under their real ids."""

from __future__ import annotations

from typing import Any

from .errors import NotFoundError
from .state import ApiState


def card(model_id: str, created: int, owned_by: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}


def cards(state: ApiState) -> list[dict[str, Any]]:
    """The text model, then the models of the other families (embeddings, speech ...)."""
    from .app import families

    host = state.host
    out = []
    if host.loaded:
        out.append(card(host.model_id, host.created or state.started, host.owned_by))
    for family in families():
        if hasattr(family, "model_cards"):
            out.extend(family.model_cards(state))
    return out


def list_models(state: ApiState) -> dict[str, Any]:
    return {"object": "list", "data": cards(state)}


def retrieve(state: ApiState, model_id: str) -> dict[str, Any]:
    for card in cards(state):
        if card["id"] == model_id:
            return card
    known = ", ".join(c["id"] for c in cards(state)) or "none"
    raise NotFoundError(f"The model '{model_id}' does not exist. Models here: {known}.",
                        param="model", code="model_not_found")
