"""The Files API's routes: /v1/files (upload, list), /v1/files/{id} (retrieve, delete) and its
content. An upload's body is counted as it arrives against files_max_mb (core/guards.py), not held
in memory: the form's file is spooled to disk by the parser, then copied under the file's id."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ..core.api_model import ApiModel, allowed
from ..core.auth import caller_owner
from ..core.errors import InvalidRequestError
from ..core.multipart import Form, form_schema, read_form
from .service import EXPIRY_RANGE, PURPOSES, FilesService

FORM = form_schema({
    "file": {"type": "string", "format": "binary"},
    "purpose": {"type": "string", "enum": list(PURPOSES)},
    "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
    "expires_after[seconds]": {"type": "integer", "minimum": EXPIRY_RANGE[0], "maximum": EXPIRY_RANGE[1]},
}, ["file", "purpose"])


def _purpose(form: Form) -> str:
    value = form.text("purpose")
    if value in (None, ""):
        raise InvalidRequestError("Missing required parameter: 'purpose'. One of: " + ", ".join(PURPOSES) + ".",
                                  param="purpose")
    if value == "evals":
        raise InvalidRequestError("purpose 'evals' is for OpenAI's Evals API, which this server does not have; "
                                  "upload the file as user_data.", param="purpose")
    if value not in PURPOSES:
        raise InvalidRequestError(f"purpose must be one of {', '.join(PURPOSES)}, not {value!r}.", param="purpose")
    return value


def _expires_after(form: Form) -> int | None:
    """The file's lifetime in seconds from its creation (expires_after[anchor], [seconds])."""
    policy = form.object("expires_after")
    if policy is None:
        return None
    if not isinstance(policy, dict) or set(policy) - {"anchor", "seconds"}:
        raise InvalidRequestError("expires_after takes anchor (created_at) and seconds, as "
                                  "expires_after[anchor]=created_at and expires_after[seconds]=N.",
                                  param="expires_after")
    if policy.get("anchor") != "created_at":
        raise InvalidRequestError("expires_after[anchor] must be created_at.", param="expires_after.anchor")
    low, high = EXPIRY_RANGE
    try:
        seconds = int(str(policy.get("seconds")))
    except ValueError:
        seconds = -1
    if not low <= seconds <= high:
        raise InvalidRequestError(f"expires_after[seconds] must be an integer from {low} (1 hour) to {high} (30 days).",
                                  param="expires_after.seconds")
    return seconds


class _UploadFields(ApiModel):
    """An upload's form fields (read by hand), for their names: any other gets a 400."""
    file: Any = None
    purpose: Any = None
    expires_after: Any = None


def router(files: FilesService) -> APIRouter:
    r = APIRouter()

    @r.post("/files", openapi_extra=FORM)
    async def upload_file(request: Request) -> dict[str, Any]:
        files.require_store()   # before the body is read
        async with read_form(request, hint="the file in a field named 'file' and its purpose", max_files=1) as form:
            assert isinstance(form, Form)   # (no JSON form for this route)
            purpose = _purpose(form)
            expires = _expires_after(form)
            upload = form.upload("file", required=True)
            assert upload is not None
            _UploadFields.refuse_unknown_in(sorted(form.names()), allow=allowed())
            return await files.create(upload, purpose, expires, caller_owner(request))

    @r.get("/files")
    async def list_files(request: Request, purpose: str | None = None,
                         limit: int = Query(10000, ge=1, le=10000),
                         order: Literal["asc", "desc"] = "desc", after: str | None = None) -> dict[str, Any]:
        return await files.list(caller_owner(request), purpose=purpose, after=after, limit=limit, order=order)

    @r.get("/files/{file_id}")
    async def retrieve_file(file_id: str, request: Request) -> dict[str, Any]:
        return await files.retrieve(file_id, caller_owner(request))

    @r.delete("/files/{file_id}")
    async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
        return await files.delete(file_id, caller_owner(request))

    @r.get("/files/{file_id}/content")
    async def file_content(file_id: str, request: Request) -> StreamingResponse:
        row, chunks = await files.content(file_id, caller_owner(request))
        return StreamingResponse(chunks, media_type="application/octet-stream",
                                 headers={"content-length": str(row.bytes)})

    return r
