"""The models this server serves, under their real ids, gathered from every family.

Each family hands the catalog a function that lists its model cards (empty when its engine is
not installed: listing a model would promise what a request cannot get)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .errors import NotFoundError

Cards = Callable[[], list[dict[str, Any]]]
# A family's card for a name it serves that is not a model of its own (OpenAI's names), or None.
Alias = Callable[[str], "dict[str, Any] | None"]


def card(model_id: str, created: int, owned_by: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": owned_by}


class Catalog:
    def __init__(self, sources: Sequence[Cards], aliases: Sequence[Alias] = ()):
        self.sources = list(sources)
        self.aliases = list(aliases)

    def cards(self) -> list[dict[str, Any]]:
        """The text model first, then the models of the other families (embeddings, speech ...)."""
        return [c for source in self.sources for c in source()]

    def retrieve(self, model_id: str, *, param: str = "model") -> dict[str, Any]:
        cards = self.cards()
        for c in cards:
            if c["id"] == model_id:
                return c
        for alias in self.aliases:
            found = alias(model_id)
            if found is not None:
                return found
        known = ", ".join(c["id"] for c in cards) or "none"
        raise NotFoundError(f"The model '{model_id}' does not exist. Models here: {known}.",
                            param=param, code="model_not_found")
