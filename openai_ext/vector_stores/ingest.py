"""Ingestion: files added to vector stores are read, chunked, embedded and stored, in the background.

Each instance takes one file at a time from the store (rows.claim: in a shared store a file is
embedded by one instance) and works on it off the event loop: the parse and the chunking on a
worker thread, the vectors from the embeddings engine's batcher (shared with /v1/embeddings, so
ingestion and live embedding requests fill the same batches). The chunks and the file's
``completed`` are written in one transaction, and only if the file is still this instance's: a
file cancelled, removed or added again meanwhile is left as it is now. A file being ingested when
its instance stops is taken up again from the start, by this instance after a restart or by
another once the first's heartbeat has stopped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
import numpy as np

from ..core.loops import Loop
from ..core.token_tables import TokenTables
from ..documents.parse import Invalid, Unsupported, extract
from ..embeddings.service import EmbeddingsService
from ..files.service import FilesService
from ..responses.service import ResponsesService
from ..responses.store_health import StoreUnavailable
from .chunk_rows import ChunkRows
from .chunking import Chunk, chunks
from .index import mean_vectors
from .rows import VectorStoreRows

log = logging.getLogger(__name__)

POLL_S = 2.0      # how often an idle instance looks for files another instance added
EMBED_GROUP = 256  # pieces sent to the batcher at once (live requests get their turn between groups)


class Ingestor:
    def __init__(self, rows: VectorStoreRows, chunk_rows: ChunkRows, responses: ResponsesService, files: FilesService,
                 embeddings: EmbeddingsService, tables: TokenTables):
        self.rows, self.chunk_rows, self.responses = rows, chunk_rows, responses
        self.files, self.embeddings, self.tables = files, embeddings, tables
        self.loop = Loop("vector store ingestion", "files wait until the server restarts")
        self.idle = asyncio.Event()   # set while nothing is left to ingest (tests wait on it)

    def start(self) -> None:
        self.loop.start(self._forever)

    def wake(self) -> None:
        self.idle.clear()
        self.loop.wake()

    async def stop(self) -> None:
        await self.loop.stop()

    async def _forever(self) -> None:
        instance = self.responses.store.instance_id
        while True:
            try:
                taken = await self._claim(instance)
                if taken is None:
                    self.idle.set()
                    await self.loop.idle(POLL_S)
                    continue
                await self.one(instance, *taken)
            except StoreUnavailable as e:
                log.warning("vector stores: the store is unavailable (%s); ingestion goes on when it is back", e)
                await anyio.sleep(POLL_S)
            except Exception:  # noqa: BLE001 - the loop must outlive any one failure
                log.exception("vector stores: ingestion failed")
                await anyio.sleep(POLL_S)

    async def _claim(self, instance: str) -> tuple[str, str, dict[str, Any]] | None:
        if not self.responses.store.exists():   # nothing stored yet: nothing to ingest
            return None
        return await self.responses.io(self.rows.claim, instance)

    async def one(self, instance: str, store_id: str, file_id: str, body: dict[str, Any]) -> None:
        try:
            texts, vectors = await self._embedded(file_id, body)
            await self.responses.io(self.chunk_rows.finish, store_id, file_id, instance, texts, vectors)
        except (Unsupported, Invalid) as e:
            code = "unsupported_file" if isinstance(e, Unsupported) else "invalid_file"
            await self.responses.io(self.rows.fail, store_id, file_id, instance, code, str(e))
            return
        except (StoreUnavailable, asyncio.CancelledError):
            raise
        except Exception as e:  # noqa: BLE001 - this file fails, named; the next one is tried (never it again)
            log.exception("vector stores: %s in %s could not be ingested", file_id, store_id)
            await self.responses.io(self.rows.fail, store_id, file_id, instance, "server_error",
                                    f"The server could not ingest the file ({type(e).__name__}: {e}).")
            return

    async def _embedded(self, file_id: str, body: dict[str, Any]) -> tuple[list[str], np.ndarray]:
        try:
            data = await anyio.to_thread.run_sync(self.files.path(file_id).read_bytes)
        except FileNotFoundError:
            raise Invalid(f"The file {file_id} was deleted before it was read.") from None
        static = body["chunking_strategy"]["static"]
        encoding = await self.tables.cl100k.get()
        parts: list[Chunk] = await anyio.to_thread.run_sync(
            lambda: chunks(extract(data, body.get("filename") or file_id), encoding,
                           static["max_chunk_size_tokens"], static["chunk_overlap_tokens"],
                           name=body.get("filename") or file_id))
        # each distinct piece embedded once: overlapping chunks share theirs (chunking.py)
        pieces = list(dict.fromkeys(p for c in parts for p in c.pieces))
        batcher = await self.embeddings.batcher.get()
        found = []
        for start in range(0, len(pieces), EMBED_GROUP):
            vectors, _ = await batcher.embed(pieces[start:start + EMBED_GROUP])
            found.append(np.asarray(vectors, dtype=np.float32))
        matrix = np.concatenate(found) if found else np.zeros((0, 0), np.float32)
        where = {p: i for i, p in enumerate(pieces)}
        each = matrix[[where[p] for c in parts for p in c.pieces]]
        return [c.text for c in parts], mean_vectors(each, [len(c.pieces) for c in parts])
