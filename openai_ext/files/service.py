"""The Files API's work: an upload kept, listed, read back byte for byte, deleted, expired.

- A file's record is a row in the store of responses (SQLite in data_dir, or PostgreSQL with
  database_url, rows.py); its content is one file named by its id in ``files_dir`` (default: the
  ``files`` folder in data_dir). Servers sharing a database share the folder too (a mount).
- An upload is written to a temporary name, flushed to the disk, renamed, and only then is its
  record written: a file the client was told of is whole on disk, and a crash leaves at most a
  content without a record (removed when the next upload finds it), never a record without one.
- Deleting removes the record first, then the content. Expired files (``expires_after``; batch
  files after 30 days by default, as OpenAI does) are invisible from their expiry and removed as
  uploads come in.
- Store calls run on the store's threads with its deadline (ResponsesService.io); the disk work
  runs on worker threads, never on the event loop.
- Ownership is the store's: with two different keys each key sees only its own files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, AsyncGenerator, Awaitable, BinaryIO, Callable

import anyio
from starlette.datastructures import UploadFile

from ..core.config import Settings
from ..core.errors import InvalidRequestError, RequestTooLargeError
from ..core.lists import cursor_page
from ..responses.history import not_found
from ..responses.service import ResponsesService, default_folder
from .rows import FileRow, FileRows

log = logging.getLogger(__name__)

# What a file may be uploaded for (the spec's CreateFileRequest). "evals" is for OpenAI's Evals API,
# which this server does not have, and the File object cannot name it: it is refused, with why.
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data")
BATCH_EXPIRY_S = 30 * 86400   # a batch file's default lifetime (OpenAI's)
EXPIRY_RANGE = (3600, 2592000)
CHUNK = 1 << 20
PURGE_MOST = 256   # expired files removed per upload


class FilesService:
    def __init__(self, settings: Settings, responses: ResponsesService):
        self.settings = settings
        self.responses = responses
        self.rows = FileRows(responses.store)
        base = Path(settings.data_dir).expanduser() if settings.data_dir else default_folder()
        self.folder = Path(settings.files_dir).expanduser() if settings.files_dir else base / "files"
        self.limit = int(settings.files_max_mb * 2 ** 20)
        self.on_delete: list[Callable[[str], Awaitable[None]]] = []   # called with a deleted file's id

    def require_store(self) -> None:
        if not self.settings.responses_store:
            raise InvalidRequestError("Files are kept in the server's store, which is off on this server (the "
                                      "responses_store setting); turn it on to upload files.", code="storage_disabled")

    def path(self, file_id: str) -> Path:
        return self.folder / file_id

    async def create(self, upload: UploadFile, purpose: str, expires_after: int | None, owner: str) -> dict[str, Any]:
        return await self.keep(upload.file, upload.filename, purpose, expires_after, owner)

    async def keep(self, source: BinaryIO, filename: str | None, purpose: str, expires_after: int | None,
                   owner: str) -> dict[str, Any]:
        """Keeps ``source``'s bytes as a file of ``owner``'s (an upload, or a batch's output); its File object."""
        self.require_store()
        now = time.time()
        if expires_after is None and purpose == "batch":
            expires_after = BATCH_EXPIRY_S
        row = FileRow(id=f"file-{uuid.uuid4().hex[:24]}", owner=owner, created_at=now,
                      expires_at=None if expires_after is None else now + expires_after, bytes=0,
                      filename=_base_name(filename), purpose=purpose)
        size = await anyio.to_thread.run_sync(self._keep, source, row.id)
        row = FileRow(**{**row.__dict__, "bytes": size})
        try:
            await self.responses.io(self.rows.put, row)
        except BaseException:
            with contextlib.suppress(OSError):
                self.path(row.id).unlink()
            raise
        await self._purge()
        return row.body()

    def _keep(self, source: BinaryIO, file_id: str) -> int:
        """Copies the upload to the folder under the file's id, flushed to the disk; its size."""
        self.folder.mkdir(parents=True, exist_ok=True)
        part = self.folder / f".{file_id}.part"
        size = 0
        try:
            source.seek(0)
            with open(part, "wb") as out:
                while chunk := source.read(CHUNK):
                    size += len(chunk)
                    if size > self.limit:   # (the body's limit counts the form around it too)
                        raise RequestTooLargeError(f"The file is over the {self.limit / 2 ** 20:g} MB limit "
                                                   "(files_max_mb).", param="file", code="file_too_large")
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(part, self.path(file_id))
        except BaseException:
            with contextlib.suppress(OSError):
                part.unlink()
            raise
        return size

    async def _purge(self) -> None:
        """Removes expired files (their records, then their contents); a failure waits for the next upload."""
        try:
            gone = await self.responses.io(self.rows.take_expired, PURGE_MOST)
        except Exception as e:  # noqa: BLE001 - the upload is done; expiry is tried again on the next
            log.warning("expired files could not be removed now (%s)", e)
            return
        for file_id in gone:
            with contextlib.suppress(OSError):
                self.path(file_id).unlink()

    async def _row(self, file_id: str, owner: str) -> FileRow:
        self.require_store()
        row = await self.responses.io(self.rows.get, file_id, self.responses.visible_to(owner))
        if row is None:
            raise not_found("File", file_id)
        return row

    async def retrieve(self, file_id: str, owner: str) -> dict[str, Any]:
        return (await self._row(file_id, owner)).body()

    async def read(self, file_id: str, owner: str) -> tuple[FileRow, bytes]:
        """A file's record and whole content (a batch's input, bounded by files_max_mb)."""
        row = await self._row(file_id, owner)
        try:
            return row, await anyio.to_thread.run_sync(self.path(file_id).read_bytes)
        except FileNotFoundError:
            raise not_found("File", file_id) from None

    async def text_source(self, file_id: str, owner: str, most: int) -> tuple[str, bytes | None]:
        """A file's name and content, for a request that reads it as input (a 404 if the caller has
        none of that id); None for the content of a file over ``most`` bytes, which is not read."""
        row = await self._row(file_id, owner)
        if row.bytes > most:
            return row.filename, None
        _, content = await self.read(file_id, owner)
        return row.filename, content

    async def list(self, owner: str, *, purpose: str | None, after: str | None, limit: int,
                   order: str) -> dict[str, Any]:
        self.require_store()
        page = await self.responses.io(lambda: self.rows.page(self.responses.visible_to(owner), purpose=purpose,
                                                              after=after, limit=limit, order=order))
        if page is None:
            raise not_found("File", after or "", param="after")
        rows, more = page
        return cursor_page([r.body() for r in rows], more)

    async def delete(self, file_id: str, owner: str) -> dict[str, Any]:
        self.require_store()
        if not await self.responses.io(self.rows.delete, file_id, self.responses.visible_to(owner)):
            raise not_found("File", file_id)
        for forget in self.on_delete:   # (the vector stores it is in: OpenAI removes it from them too)
            await forget(file_id)
        with contextlib.suppress(OSError):
            await anyio.to_thread.run_sync(self.path(file_id).unlink)
        return {"id": file_id, "object": "file", "deleted": True}

    async def content(self, file_id: str, owner: str) -> tuple[FileRow, AsyncGenerator[bytes, None]]:
        """The record and the content's chunks; the content is opened before the answer starts,
        so a file deleted meanwhile is still read whole (or is a 404, not a cut body)."""
        row = await self._row(file_id, owner)
        try:
            handle = await anyio.to_thread.run_sync(open, self.path(file_id), "rb")
        except FileNotFoundError:
            raise not_found("File", file_id) from None

        async def chunks() -> AsyncGenerator[bytes, None]:
            try:
                while chunk := await anyio.to_thread.run_sync(handle.read, CHUNK):
                    yield chunk
            finally:
                handle.close()
        return row, chunks()

    def close(self) -> None:
        """Nothing to stop: the store is the Responses family's."""


def _base_name(name: str | None) -> str:
    """The name the client gave, without any folders (it is only reported back)."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    return base or "file"
