"""GET /v1/models: the models this server really has loaded, under their real ids."""

from __future__ import annotations

from typing import Any

from .errors import NotFoundError
from .state import ApiState


def cards(state: ApiState) -> list[dict[str, Any]]:
    host = state.host
    out = []
    if host.loaded:
        out.append({"id": host.model_id, "object": "model", "created": host.created or state.started,
                    "owned_by": host.owned_by})
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
