"""ApiState: everything the running server shares, as named, typed fields, one per family.

Each family's service is built once, at start, with what it needs handed in (settings, token
tables, another family's service); its routes are built over it. Nothing is looked up by a
string key, and the families never import this module or the app.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .audio.speech import SpeechService
from .audio.transcription import TranscriptionService
from .batches.service import BatchesService
from .core.catalog import Catalog
from .core.config import Settings
from .core.token_tables import TokenTables
from .embeddings.service import EmbeddingsService
from .files.service import FilesService
from .hosts.base import Host
from .hosts.manager import ModelManager
from .images.service import ImagesService
from .moderations.service import ModerationsService
from .realtime.service import RealtimeService
from .responses.service import ResponsesService
from .text.service import TextService
from .vector_stores.service import VectorStoresService


@dataclass
class ApiState:
    settings: Settings
    text: TextService
    tables: TokenTables
    embeddings: EmbeddingsService
    moderations: ModerationsService
    speech: SpeechService
    transcription: TranscriptionService
    images: ImagesService
    catalog: Catalog
    responses: ResponsesService
    realtime: RealtimeService
    files: FilesService
    batches: BatchesService
    vector_stores: VectorStoresService
    manager: ModelManager | None = None   # model management (StandaloneModels / TextgenModels)
    started: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def build(cls, settings: Settings, host: Host, manager: ModelManager | None = None) -> "ApiState":
        started = int(time.time())
        text = TextService(settings, host, started=started)
        tables = TokenTables()
        embeddings = EmbeddingsService(settings, tables, started=started)
        moderations = ModerationsService(settings, embeddings, started=started)
        speech = SpeechService(settings, tables, started=started)
        transcription = TranscriptionService(settings, started=started)
        # /v1/models lists the text model first, then the other families' models
        catalog = Catalog([text.model_cards, embeddings.model_cards, moderations.model_cards,
                           speech.model_cards, transcription.model_cards],
                          aliases=[embeddings.alias_card])
        images = ImagesService(settings, lambda: text.host)   # the web UI's image model, where it has one
        realtime = RealtimeService(settings, text, speech, transcription)
        responses = ResponsesService(settings, text)
        files = FilesService(settings, responses)   # its records are in the responses' store
        batches = BatchesService(settings, responses, files, text)
        vector_stores = VectorStoresService(settings, responses, files, embeddings, tables)
        responses.searcher = vector_stores   # what Responses' file_search tool searches
        responses.file_reader = text.file_reader = files.text_source   # input_file and chat's file parts
        files.on_delete.append(vector_stores.forget_file)   # a deleted file leaves every vector store
        return cls(settings, text, tables, embeddings, moderations, speech, transcription,
                   images, catalog, responses, realtime, files, batches, vector_stores, manager, started)

    @property
    def host(self) -> Host:
        """The text host that serves now (model management swaps it)."""
        return self.text.host

    def close(self) -> None:
        """Closes every family's engines and stops their threads. The text host is closed by
        whoever made it: in extension mode it is the web UI's own model."""
        for service in (self.realtime, self.responses, self.text, self.embeddings, self.moderations, self.speech,
                        self.transcription):
            service.close()
