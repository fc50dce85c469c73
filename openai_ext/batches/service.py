"""The Batch API's work: a batch created from an uploaded JSONL file, retrieved with live request
counts, listed, cancelled; run by run.Runner on the server's own event loop.

A batch is a row in the store of responses (rows.py), so it survives a restart and servers sharing
a PostgreSQL store share it (one of them runs it). Its output and error files are Files of the
batch's owner (purpose batch_output). Ownership is the store's, as for responses and files.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..core.api_model import ApiModel
from ..core.config import Settings
from ..core.errors import InvalidRequestError
from ..core.lists import cursor_page
from ..files.service import EXPIRY_RANGE, FilesService
from ..responses.history import not_found
from ..responses.protocol import Metadata
from ..responses.service import ResponsesService
from ..text.service import TextService
from .lines import ENDPOINTS
from .rows import BatchRows
from .run import Runner

WINDOW_S = 24 * 3600


class OutputExpiry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    anchor: Literal["created_at"]
    seconds: Annotated[int, Field(ge=EXPIRY_RANGE[0], le=EXPIRY_RANGE[1])]


class CreateBatch(ApiModel):
    input_file_id: str
    endpoint: str
    completion_window: Literal["24h"]
    metadata: Metadata | None = None
    output_expires_after: OutputExpiry | None = None


class BatchesService:
    def __init__(self, settings: Settings, responses: ResponsesService, files: FilesService, text: TextService):
        self.settings = settings
        self.responses = responses
        self.files = files
        self.text = text
        self.rows = BatchRows(responses.store)
        self.runner = Runner(self.rows, responses, files, text)

    def _require_store(self) -> None:
        if not self.settings.responses_store:
            raise InvalidRequestError("Batches are kept in the server's store, which is off on this server (the "
                                      "responses_store setting); turn it on to run batches.", code="storage_disabled")

    async def start(self, app: Any) -> None:
        """Begins taking batches (on the app's event loop, at its start)."""
        if self.settings.responses_store:
            self.runner.start(app)

    async def stop(self) -> None:
        await self.runner.stop()

    async def create(self, body: CreateBatch, owner: str) -> dict[str, Any]:
        self._require_store()
        if body.endpoint not in ENDPOINTS:
            raise InvalidRequestError(f"endpoint must be one of {', '.join(ENDPOINTS)}; this server does not run "
                                      f"{body.endpoint!r} in batches.", param="endpoint")
        record = await self.files.retrieve(body.input_file_id, owner)
        if record["purpose"] != "batch":
            raise InvalidRequestError(f"The input file {body.input_file_id} was uploaded with purpose "
                                      f"{record['purpose']!r}; a batch's file must be uploaded with purpose 'batch'.",
                                      param="input_file_id")
        now = int(time.time())
        batch: dict[str, Any] = {
            "id": f"batch_{uuid.uuid4().hex[:24]}", "object": "batch", "endpoint": body.endpoint,
            "input_file_id": body.input_file_id, "completion_window": "24h", "status": "validating",
            "created_at": now, "expires_at": now + WINDOW_S, "metadata": body.metadata or {},
            "request_counts": {"total": 0, "completed": 0, "failed": 0}}
        stored = dict(batch)
        if body.output_expires_after is not None:
            stored["_output_expires_after"] = body.output_expires_after.seconds
        await self.responses.io(self.rows.put, stored, owner)
        self.runner.wake()
        return batch

    async def retrieve(self, batch_id: str, owner: str) -> dict[str, Any]:
        self._require_store()
        batch = await self.responses.io(self.rows.get, batch_id, self.responses.visible_to(owner))
        if batch is None:
            raise not_found("Batch", batch_id)
        return batch

    async def list(self, owner: str, *, after: str | None, limit: int) -> dict[str, Any]:
        self._require_store()
        page = await self.responses.io(self.rows.page, self.responses.visible_to(owner), after, limit)
        if page is None:
            raise not_found("Batch", after or "", param="after")
        return cursor_page(*page)

    async def cancel(self, batch_id: str, owner: str) -> dict[str, Any]:
        self._require_store()
        batch = await self.responses.io(self.rows.cancel, batch_id, self.responses.visible_to(owner), int(time.time()))
        if batch is None:
            raise not_found("Batch", batch_id)
        if batch["status"] not in ("cancelling", "cancelled"):
            raise InvalidRequestError(f"The batch is {batch['status']}; only a batch that is validating or in "
                                      "progress can be cancelled.", code="batch_not_cancellable")
        self.runner.wake()
        return batch

    def close(self) -> None:
        """The runner stops with the app's event loop (``stop``)."""
