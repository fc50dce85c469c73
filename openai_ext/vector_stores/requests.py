"""The request bodies of the vector store routes (the spec's Create/Update/Search requests)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..core.api_model import ApiModel
from ..responses.protocol import Metadata
from .filters import Attributes, Filter


class Expiry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    anchor: Literal["last_active_at"]
    days: Annotated[int, Field(ge=1, le=365)]


class StaticChunking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_chunk_size_tokens: Annotated[int, Field(ge=100, le=4096)]
    chunk_overlap_tokens: Annotated[int, Field(ge=0)]

    @field_validator("chunk_overlap_tokens")
    @classmethod
    def _half(cls, overlap: int, info: ValidationInfo) -> int:
        size = info.data.get("max_chunk_size_tokens")   # (absent when it was refused itself)
        if size is not None and overlap > size // 2:
            raise ValueError(f"chunk_overlap_tokens ({overlap}) must not exceed half of max_chunk_size_tokens ({size})")
        return overlap


class ChunkingStrategy(BaseModel):
    """The spec's ChunkingStrategyRequestParam, auto or static. One model, not a union told apart
    by ``type``: pydantic puts a union's tag in an error's location, and the 400 would name
    'chunking_strategy.static.static.max_chunk_size_tokens', a path the request does not have."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "static"]
    static: StaticChunking | None = None

    @model_validator(mode="after")
    def _static_with_static(self) -> "ChunkingStrategy":
        if self.type == "static" and self.static is None:
            raise ValueError("a static chunking_strategy needs static: {max_chunk_size_tokens, chunk_overlap_tokens}")
        if self.type == "auto" and self.static is not None:
            raise ValueError("an auto chunking_strategy takes no static settings; send type 'static' with them")
        return self


Chunking = ChunkingStrategy


def chunking_dict(value: ChunkingStrategy | None) -> dict[str, Any] | None:
    return None if value is None else value.model_dump(exclude_none=True)


class CreateVectorStore(ApiModel):
    file_ids: Annotated[list[str], Field(max_length=500)] | None = None
    name: str | None = None
    description: str | None = None
    expires_after: Expiry | None = None
    chunking_strategy: Chunking | None = None
    metadata: Metadata | None = None


class ModifyVectorStore(ApiModel):
    name: str | None = None
    expires_after: Expiry | None = None
    metadata: Metadata | None = None


class CreateVectorStoreFile(ApiModel):
    file_id: str
    chunking_strategy: Chunking | None = None
    attributes: Attributes = None


class CreateFileBatch(ApiModel):
    file_ids: Annotated[list[str], Field(min_length=1, max_length=2000)] | None = None
    files: Annotated[list[CreateVectorStoreFile], Field(min_length=1, max_length=2000)] | None = None
    chunking_strategy: Chunking | None = None
    attributes: Attributes = None

    @model_validator(mode="after")
    def _one_list(self) -> "CreateFileBatch":
        if (self.file_ids is None) == (self.files is None):
            raise ValueError("Send exactly one of file_ids and files.")
        return self


class UpdateAttributes(ApiModel):
    attributes: Attributes


class RankingOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ranker: Literal["none", "auto", "default-2024-11-15"] = "auto"
    score_threshold: Annotated[float, Field(ge=0, le=1)] = 0.0


class SearchRequest(ApiModel):
    query: Union[str, Annotated[list[str], Field(min_length=1, max_length=10)]]
    rewrite_query: bool = False
    max_num_results: Annotated[int, Field(ge=1, le=50)] = 10
    filters: Filter | None = None
    ranking_options: RankingOptions | None = None


class ToolRanking(BaseModel):
    """The file_search tool's ranking_options (the spec's RankingOptions)."""
    model_config = ConfigDict(extra="forbid")
    ranker: Literal["none", "auto", "default-2024-11-15"] = "auto"
    score_threshold: Annotated[float, Field(ge=0, le=1)] = 0.0
    hybrid_search: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _no_hybrid(self) -> "ToolRanking":
        if self.hybrid_search is not None:
            raise ValueError("hybrid_search (keyword matches fused with the embedding's) is not done here: the "
                             "search ranks by embedding similarity alone. Leave hybrid_search out.")
        return self


class FileSearchTool(BaseModel):
    """Responses' ``file_search`` tool (the spec's FileSearchTool)."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["file_search"]
    vector_store_ids: Annotated[list[str], Field(min_length=1, max_length=16)]
    max_num_results: Annotated[int, Field(ge=1, le=50)] | None = None
    ranking_options: ToolRanking | None = None
    filters: Filter | None = None
