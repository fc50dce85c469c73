"""GET /v1/models as Anthropic lists models, for the requests that carry anthropic-version.

Anthropic's clients list models at the same path as OpenAI's, and send anthropic-version with
every request, so that header chooses this shape. It lists the text model only: the one model
that /v1/messages serves (the embedding and speech models of /v1/models serve other routes).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ..core.errors import InvalidRequestError, NotFoundError
from ..text.service import TextService

HEADER = "anthropic-version"


def _when(ts: int) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


class AnthropicModels:
    header = HEADER

    def __init__(self, text: TextService):
        self.text = text

    def _infos(self) -> list[dict[str, Any]]:
        ctx = self.text.host.context_length() if self.text.host.loaded else None
        return [{"type": "model", "id": c["id"], "display_name": c["id"], "created_at": _when(c["created"]),
                 "lifecycle": "active", "max_input_tokens": ctx}
                for c in self.text.model_cards()]

    def list(self, query: dict[str, str]) -> dict[str, Any]:
        """One page, with Anthropic's cursors (after_id, before_id) and limit (1-1000, default 20)."""
        infos = self._infos()
        ids = [m["id"] for m in infos]
        raw = query.get("limit", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= 1000:
            raise InvalidRequestError("limit must be an integer from 1 to 1000.", param="limit")
        limit = int(raw)
        start, end = 0, len(infos)
        for name in ("after_id", "before_id"):
            if name in query and query[name] not in ids:
                raise InvalidRequestError(f"{name} '{query[name]}' is not the id of a listed model.", param=name)
        if "after_id" in query:
            start = ids.index(query["after_id"]) + 1
        if "before_id" in query:
            end = ids.index(query["before_id"])
            start = max(start, end - limit)
        page = infos[start:end][:limit]
        return {"data": page, "has_more": start + len(page) < end,
                "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None}

    def retrieve(self, model_id: str) -> dict[str, Any]:
        for info in self._infos():
            if info["id"] == model_id:
                return info
        known = ", ".join(c["id"] for c in self.text.model_cards()) or "none"
        raise NotFoundError(f"model: {model_id} was not found. Models here: {known}.", param="model",
                            code="model_not_found")
