"""The vector store API's work: stores made, listed, changed and deleted; files added (one at a
time or in batches), listed, given attributes, read back, removed; searches.

Everything is kept in the store of responses (rows.py, chunk_rows.py), so a restart loses nothing
and servers sharing a PostgreSQL store share the vector stores; ingestion runs in the background
(ingest.py); searches read an in-memory matrix per store (index.py). Ownership is the store's, as
for files: with two different keys, each key sees, fills and searches only its own stores.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from typing import Any

import anyio

from ..batches.run import call
from ..core.config import Settings
from ..core.errors import InvalidRequestError, NotFoundError
from ..core.lists import cursor_page
from ..core.token_tables import TokenTables
from ..documents.parse import extract
from ..embeddings.service import EmbeddingsService
from ..files.service import FilesService
from ..responses.history import not_found
from ..responses.service import ResponsesService
from .chunk_rows import ChunkRows, Matrix
from .chunking import strategy
from .filters import Comparison, Compound
from .index import Hit, Indexes, as_unit, search
from .ingest import Ingestor
from .requests import (
    CreateFileBatch,
    CreateVectorStore,
    CreateVectorStoreFile,
    FileSearchTool,
    ModifyVectorStore,
    SearchRequest,
    chunking_dict,
)
from .rows import VectorStoreRows

REWRITE = ("Rewrite the user's question as a short search query of its key words, for searching documents. "
           "Answer with the query alone.")


class VectorStoresService:
    def __init__(self, settings: Settings, responses: ResponsesService, files: FilesService,
                 embeddings: EmbeddingsService, tables: TokenTables):
        self.settings, self.responses, self.files, self.embeddings = settings, responses, files, embeddings
        self.rows = VectorStoreRows(responses.store)
        self.chunk_rows = ChunkRows(responses.store)
        self.indexes = Indexes(int(settings.vector_cache_mb * 2 ** 20))
        self.ingestor = Ingestor(self.rows, self.chunk_rows, responses, files, embeddings, tables)
        self.app: Any = None   # the ASGI app a query rewrite is generated through

    def require_store(self) -> None:
        if not self.settings.responses_store:
            raise InvalidRequestError("Vector stores are kept in the server's store, which is off on this server "
                                      "(the responses_store setting); turn it on to use them.",
                                      code="storage_disabled")

    async def start(self, app: Any) -> None:
        self.app = app
        if self.settings.responses_store:
            self.ingestor.start()

    async def stop(self) -> None:
        await self.ingestor.stop()

    def _who(self, owner: str) -> str | None:
        return self.responses.visible_to(owner)

    # stores ------------------------------------------------------------------------------------
    async def create(self, body: CreateVectorStore, owner: str) -> dict[str, Any]:
        self.require_store()
        store_id = f"vs_{uuid.uuid4().hex[:24]}"
        entries = await self._entries([(f, None, None) for f in body.file_ids or []], chunking_dict(
            body.chunking_strategy), None, owner, "file_ids")
        doc = {"name": body.name, "description": body.description, "metadata": body.metadata or {},
               "expires_after": None if body.expires_after is None else body.expires_after.model_dump()}
        now = time.time()
        await self.responses.io(self.rows.put, store_id, owner, now, doc)
        if entries:
            await self.responses.io(self.rows.add_files, store_id, None, entries, None, now)
            self.ingestor.wake()
        return await self.retrieve(store_id, owner)

    async def retrieve(self, store_id: str, owner: str) -> dict[str, Any]:
        self.require_store()
        found = await self.responses.io(self.rows.get, store_id, self._who(owner))
        if found is None:
            raise not_found("Vector store", store_id)
        return found

    async def list_stores(self, owner: str, *, order: str, after: str | None, before: str | None,
                   limit: int) -> dict[str, Any]:
        self.require_store()
        page = await self.responses.io(lambda: self.rows.page(self._who(owner), order=order, after=after,
                                                              before=before, limit=limit))
        if page is None:
            raise not_found("Vector store", after or before or "", param="after" if after else "before")
        return cursor_page(*page)

    async def modify(self, store_id: str, body: ModifyVectorStore, owner: str) -> dict[str, Any]:
        self.require_store()
        sent = body.model_fields_set   # a field sent as null is cleared; one not sent is kept
        changes: dict[str, Any] = {}
        if "name" in sent:
            changes["name"] = body.name
        if "metadata" in sent:
            changes["metadata"] = body.metadata or {}
        if "expires_after" in sent:
            changes["expires_after"] = None if body.expires_after is None else body.expires_after.model_dump()
        found = await self.responses.io(self.rows.modify, store_id, self._who(owner), changes)
        if found is None:
            raise not_found("Vector store", store_id)
        return found

    async def delete(self, store_id: str, owner: str) -> dict[str, Any]:
        self.require_store()
        if not await self.responses.io(self.rows.delete, store_id, self._who(owner)):
            raise not_found("Vector store", store_id)
        self.indexes.forget(store_id)
        await self.responses.io(self.chunk_rows.purge, store_id)   # (gone for every reader already)
        return {"id": store_id, "object": "vector_store.deleted", "deleted": True}

    # files -------------------------------------------------------------------------------------
    async def _entries(self, wanted: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]],
                       chunking: dict[str, Any] | None, attributes: dict[str, Any] | None, owner: str,
                       param: str) -> list[tuple[str, dict[str, Any]]]:
        """Each (file id, chunking, attributes) as a vector store file's body; every file must be
        one the caller may read (a 404 names the first that is not)."""
        out: list[tuple[str, dict[str, Any]]] = []
        for i, (file_id, own_chunking, own_attributes) in enumerate(wanted):
            try:
                record = await self.files.retrieve(file_id, owner)
            except NotFoundError:
                raise not_found("File", file_id, param=f"{param}[{i}]" if param.endswith("s") else param) from None
            out.append((file_id, {"filename": record["filename"],
                                  "chunking_strategy": strategy(own_chunking or chunking),
                                  "attributes": own_attributes if own_attributes is not None else attributes}))
        return out

    async def forget_file(self, file_id: str) -> None:
        """A file deleted from the Files API leaves every vector store it was in, as at OpenAI."""
        await self.responses.io(self.rows.remove_everywhere, file_id)

    async def _open(self, store_id: str, owner: str) -> None:
        """The store exists, is the caller's, and has not expired (files are added to live stores only)."""
        if (await self.retrieve(store_id, owner))["status"] == "expired":
            raise InvalidRequestError(f"The vector store {store_id} has expired (expires_after); make a new one.",
                                      param="vector_store_id", code="vector_store_expired")

    async def add_file(self, store_id: str, body: CreateVectorStoreFile, owner: str) -> dict[str, Any]:
        self.require_store()
        await self._open(store_id, owner)
        entries = await self._entries([(body.file_id, None, None)], chunking_dict(body.chunking_strategy),
                                      body.attributes, owner, "file_id")
        added = await self.responses.io(self.rows.add_files, store_id, self._who(owner), entries, None, time.time())
        if added is None:
            raise not_found("Vector store", store_id)
        self.ingestor.wake()
        return added[0]

    async def add_batch(self, store_id: str, body: CreateFileBatch, owner: str) -> dict[str, Any]:
        self.require_store()
        await self._open(store_id, owner)
        if body.files is not None:
            wanted = [(f.file_id, chunking_dict(f.chunking_strategy), f.attributes) for f in body.files]
            entries = await self._entries(wanted, None, None, owner, "files")
        else:
            entries = await self._entries([(f, None, None) for f in body.file_ids or []],
                                          chunking_dict(body.chunking_strategy), body.attributes, owner, "file_ids")
        batch_id, now = f"vsfb_{uuid.uuid4().hex[:24]}", time.time()
        await self.responses.io(self.rows.put_batch, batch_id, store_id, now)
        await self.responses.io(self.rows.add_files, store_id, self._who(owner), entries, batch_id, now)
        self.ingestor.wake()
        return await self.batch(store_id, batch_id, owner)

    async def batch(self, store_id: str, batch_id: str, owner: str, *, cancel: bool = False) -> dict[str, Any]:
        self.require_store()
        found = await self.responses.io(lambda: self.rows.batch(store_id, batch_id, self._who(owner), cancel=cancel))
        if found is None:
            await self.retrieve(store_id, owner)   # the store's 404 before the batch's
            raise not_found("Vector store file batch", batch_id)
        return found

    async def file(self, store_id: str, file_id: str, owner: str) -> dict[str, Any]:
        self.require_store()
        found = await self.responses.io(self.rows.get_file, store_id, file_id, self._who(owner))
        if found is None:
            await self.retrieve(store_id, owner)   # the store's 404 before the file's
            raise not_found("Vector store file", file_id)
        return found

    async def files_page(self, store_id: str, owner: str, *, status: str | None, batch_id: str | None, order: str,
                         after: str | None, before: str | None, limit: int) -> dict[str, Any]:
        self.require_store()
        if batch_id is not None:
            await self.batch(store_id, batch_id, owner)
        page = await self.responses.io(lambda: self.rows.page_files(
            store_id, self._who(owner), status=status, batch_id=batch_id, order=order, after=after, before=before,
            limit=limit))
        if page is None:
            await self.retrieve(store_id, owner)   # the store's 404 before the cursor's
            raise not_found("Vector store file", after or before or "", param="after" if after else "before")
        return cursor_page(*page)

    async def update_file(self, store_id: str, file_id: str, attributes: dict[str, Any] | None,
                          owner: str) -> dict[str, Any]:
        self.require_store()
        found = await self.responses.io(self.rows.update_attributes, store_id, file_id, self._who(owner), attributes)
        if found is None:
            await self.retrieve(store_id, owner)
            raise not_found("Vector store file", file_id)
        return found

    async def delete_file(self, store_id: str, file_id: str, owner: str) -> dict[str, Any]:
        self.require_store()
        if not await self.responses.io(self.rows.delete_file, store_id, file_id, self._who(owner)):
            await self.retrieve(store_id, owner)
            raise not_found("Vector store file", file_id)
        return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}

    async def content(self, store_id: str, file_id: str, owner: str) -> dict[str, Any]:
        """The file's text as it was parsed (read again from the file; its chunks if it is gone)."""
        found = await self.file(store_id, file_id, owner)
        if found["status"] != "completed":
            raise InvalidRequestError(f"The file is {found['status']} in this vector store; its content is there "
                                      "once it is completed.", param="file_id")
        try:
            filename = (await self.files.retrieve(file_id, owner))["filename"]
            data = await anyio.to_thread.run_sync(self.files.path(file_id).read_bytes)
            texts = [await anyio.to_thread.run_sync(extract, data, filename)]
        except Exception:  # noqa: BLE001 - the file itself is gone: what was indexed is still the answer
            texts = await self.responses.io(self.chunk_rows.file_texts, store_id, file_id)
        return {"object": "vector_store.file_content.page", "data": [{"type": "text", "text": t} for t in texts],
                "has_more": False, "next_page": None}

    # search ------------------------------------------------------------------------------------
    async def search(self, store_id: str, body: SearchRequest, owner: str) -> dict[str, Any]:
        self.require_store()
        queries = [body.query] if isinstance(body.query, str) else list(body.query)
        if not any(q.strip() for q in queries):
            raise InvalidRequestError("query is empty; send the text to search for.", param="query")
        if body.rewrite_query:
            queries = [await self.rewrite(q, owner) for q in queries]
        ranking = body.ranking_options
        data = await self.find([store_id], queries, owner, filters=body.filters, most=body.max_num_results,
                               threshold=ranking.score_threshold if ranking else 0.0)
        return {"object": "vector_store.search_results.page", "search_query": queries, "data": data,
                "has_more": False, "next_page": None}

    async def find(self, store_ids: list[str], queries: list[str], owner: str, *,
                   filters: Comparison | Compound | None, most: int, threshold: float,
                   param: str = "vector_store_id") -> list[dict[str, Any]]:
        """The ``most`` best chunks of ``store_ids`` for ``queries``, as search results (file_search reads them too)."""
        self.require_store()
        looks = []
        for store_id in store_ids:
            looked = await self.responses.io(self.rows.touch, store_id, self._who(owner))
            if looked is None:
                raise not_found("Vector store", store_id, param=param)
            if looked[0]:
                raise InvalidRequestError(f"The vector store {store_id} has expired (expires_after); make a new one.",
                                          param=param, code="vector_store_expired")
            looks.append((store_id, looked[1]))
        batcher = await self.embeddings.batcher.get()
        vectors, _ = await batcher.embed([q for q in queries if q.strip()] or queries)
        wanted = as_unit(vectors)
        hits: list[tuple[float, str, Matrix, Hit]] = []
        for store_id, version in looks:
            matrix = await self.responses.io(self.indexes.get, store_id, version,
                                             functools.partial(self.chunk_rows.matrix, store_id))
            if matrix.files and matrix.vectors.shape[1] != wanted.shape[1]:
                raise InvalidRequestError(f"The vector store {store_id} was embedded with another model "
                                          f"({matrix.vectors.shape[1]} dimensions); add its files again.", param=param)
            found = await anyio.to_thread.run_sync(functools.partial(search, matrix, wanted, filters=filters,
                                                                     threshold=threshold, most=most))
            hits += [(h.score, store_id, matrix, h) for h in found]
        hits.sort(key=lambda h: -h[0])
        out: list[dict[str, Any]] = []
        for store_id in {h[1] for h in hits[:most]}:
            chosen = [h for h in hits[:most] if h[1] == store_id]
            texts = await self.responses.io(self.chunk_rows.texts, store_id,
                                            [(h[2].files[h[3].file], h[3].seq) for h in chosen])
            for score, _, matrix, hit in chosen:
                key = (matrix.files[hit.file], hit.seq)
                if key in texts:
                    out.append({"file_id": key[0], "filename": matrix.filenames[hit.file], "score": score,
                                "attributes": matrix.attributes[hit.file],
                                "content": [{"type": "text", "text": texts[key]}]})
        out.sort(key=lambda r: -r["score"])
        return out

    async def check_stores(self, store_ids: list[str], owner: str, param: str) -> None:
        self.require_store()
        for i, store_id in enumerate(store_ids):
            found = await self.responses.io(self.rows.get, store_id, self._who(owner))
            if found is None:
                raise not_found("Vector store", store_id, param=f"{param}[{i}]")
            if found["status"] == "expired":
                raise InvalidRequestError(f"The vector store {store_id} has expired (expires_after); make a new one.",
                                          param=f"{param}[{i}]", code="vector_store_expired")

    async def search_tool(self, tool: FileSearchTool, queries: list[str], owner: str) -> list[dict[str, Any]]:
        """What Responses' file_search tool runs: its stores searched as the tool says."""
        ranking = tool.ranking_options
        return await self.find(tool.vector_store_ids, queries, owner, filters=tool.filters,
                               most=tool.max_num_results or 10, threshold=ranking.score_threshold if ranking else 0.0,
                               param="tools.vector_store_ids")

    async def rewrite(self, query: str, owner: str) -> str:
        """The query as the chat model rewrites it for search (rewrite_query); the query itself if
        the model gives nothing usable."""
        body = {"model": "default", "temperature": 0, "max_tokens": 48,
                "messages": [{"role": "system", "content": REWRITE}, {"role": "user", "content": query}]}
        status, answer = await call(self.app, "/v1/chat/completions", body, owner, asyncio.Event(), background=False)
        try:
            text = str(answer["choices"][0]["message"]["content"] or "").strip().strip('"').splitlines()[0]
        except (KeyError, IndexError, TypeError):
            return query
        return text if status == 200 and text.strip() else query

    def close(self) -> None:
        """The ingestor stops with the app's event loop (``stop``)."""
