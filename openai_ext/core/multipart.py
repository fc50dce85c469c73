"""Multipart uploads (audio for transcriptions, images for edits), read the way OpenAI's clients
send them, with a 400 that names the field for every mistake.

Routes that take a form read it themselves (for those errors), so FastAPI cannot derive the body
from a model; ``form_schema`` documents it in the app's OpenAPI schema instead, so clients and the
fuzz tests see the fields.
"""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any, AsyncGenerator

from fastapi import Request
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import InvalidRequestError, RequestTooLargeError


@contextlib.asynccontextmanager
async def read_form(request: Request, *, hint: str, max_files: int = 4, max_fields: int = 256,
                    json_files: dict[str, str] | None = None) -> AsyncGenerator["Form | JsonForm", None]:
    """The request's form; its uploads' spooled files are closed on leaving, whatever happens.
    ``hint`` says which file field the route wants, for a request that is not multipart.
    ``json_files`` lets the route take OpenAI's JSON body form too, where files are references
    (file field -> the JSON field holding its reference, see JsonForm)."""
    content_type = request.headers.get("content-type", "")
    if json_files and content_type.lower().startswith("application/json"):
        try:
            doc = json.loads(await request.body())
        except ValueError:
            raise InvalidRequestError("The request body is not valid JSON.") from None
        if not isinstance(doc, dict):
            raise InvalidRequestError("The request body must be a JSON object.")
        yield JsonForm(doc, json_files)
        return
    if not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequestError(f"Send the request as multipart/form-data, with {hint} (OpenAI's clients do "
                                  "this).", code="invalid_content_type")
    try:
        # Starlette keeps small files in memory and spools larger ones to disk while parsing.
        form = await request.form(max_files=max_files, max_fields=max_fields)
    except StarletteHTTPException as e:
        raise InvalidRequestError(f"The multipart body could not be parsed: {e.detail}.") from None
    try:
        yield Form(form)
    finally:
        await form.close()


class _Fields:
    """The questions both forms answer alike, from a field's text."""

    def text(self, name: str) -> str | None:
        raise NotImplementedError

    def integer(self, name: str, low: int, high: int, default: int) -> int:
        raw = self.text(name)
        if raw in (None, ""):
            return default
        try:
            value = int(raw)
        except ValueError:
            raise InvalidRequestError(f"{name} must be an integer.", param=name) from None
        if not low <= value <= high:
            raise InvalidRequestError(f"{name} must be from {low} to {high}.", param=name)
        return value

    def choice(self, name: str, choices: tuple[str, ...]) -> str | None:
        value = self.text(name)
        if value in (None, ""):
            return None
        if value not in choices:
            raise InvalidRequestError(f"{name} must be one of {', '.join(choices)}.", param=name)
        return value

    def flag(self, name: str) -> bool:
        value = self.text(name)
        if value is None or value.strip().lower() in ("", "false", "0", "no", "off"):
            return False
        if value.strip().lower() in ("true", "1", "yes", "on"):
            return True
        raise InvalidRequestError(f"Invalid value for '{name}': {value!r}. Use true or false.", param=name)


class Form(_Fields):
    """Fields of a multipart form: lists as repeated ``name[]`` fields (or a JSON array), objects
    as ``name[key]`` fields (or a JSON object)."""

    def __init__(self, form: FormData):
        self.form = form

    def names(self) -> set[str]:
        return {key.split("[", 1)[0] for key in self.form.keys()}

    def text(self, name: str) -> str | None:
        """None when absent, else its string value. A file part under a text field's name, or the
        field given twice, is the client's mistake."""
        values = self.form.getlist(name)
        if not values:
            return None
        if len(values) > 1:
            raise InvalidRequestError(f"'{name}' was given {len(values)} times; give it once.", param=name)
        if not isinstance(values[0], str):
            filename = getattr(values[0], "filename", None)
            raise InvalidRequestError(
                f"'{name}' must be a text field, but it was sent as a file{f' ({filename})' if filename else ''}; "
                f"send its value as plain text (e.g. curl -F '{name}=...', not -F '{name}=@file').", param=name)
        return values[0]

    def many(self, name: str) -> list[str] | None:
        values = self.form.getlist(f"{name}[]") + self.form.getlist(name)
        if not values:
            return None
        out: list[str] = []
        for v in values:
            if not isinstance(v, str):
                raise InvalidRequestError(f"'{name}' must be text, not a file.", param=name)
            if v.lstrip().startswith("["):
                try:
                    parsed = json.loads(v)
                except json.JSONDecodeError:
                    raise InvalidRequestError(f"'{name}' is not a valid JSON array.", param=name) from None
                if not isinstance(parsed, list) or not all(isinstance(x, str) for x in parsed):
                    raise InvalidRequestError(f"'{name}' must be a list of strings.", param=name)
                out += parsed
            else:
                out.append(v)
        return out

    def object(self, name: str) -> dict[str, Any] | str | None:
        prefix = f"{name}["
        keyed = {k[len(prefix):-1]: v for k, v in self.form.multi_items() if k.startswith(prefix) and k.endswith("]")}
        if keyed:
            return keyed
        value = self.text(name)
        if value is not None and value.lstrip().startswith("{"):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError:
                raise InvalidRequestError(f"'{name}' is not valid JSON.", param=name) from None
            if not isinstance(parsed, dict):
                raise InvalidRequestError(f"'{name}' must be a JSON object or a string.", param=name)
            return parsed
        return value

    async def file(self, name: str, *, required: bool, limit: int | None = None,
                   example: str = "file.bin") -> tuple[str | None, bytes] | None:
        """(filename, bytes) of the one file in field ``name`` (or ``name[]``). A file over
        ``limit`` bytes is refused from its parsed size, without reading it into memory."""
        upload = self.upload(name, required=required, example=example)
        if upload is None:
            return None
        if limit is not None and upload.size is not None and upload.size > limit:
            raise RequestTooLargeError(f"The file is {upload.size / 2 ** 20:.1f} MB, over the {limit / 2 ** 20:g} MB "
                                       "limit (max_upload_mb). Send a smaller or more compressed file.",
                                       param=name, code="file_too_large")
        return upload.filename, await upload.read()

    def upload(self, name: str, *, required: bool, example: str = "file.bin") -> UploadFile | None:
        """The one file in field ``name`` (or ``name[]``), as parsed (spooled to disk when large)."""
        items = self.form.getlist(name) + self.form.getlist(f"{name}[]")
        files = [i for i in items if isinstance(i, UploadFile)]
        if not files:
            if items:
                raise InvalidRequestError(f"'{name}' must be sent as a file, not as a text field "
                                          f"(e.g. curl -F '{name}=@{example}').", param=name)
            if required:
                raise InvalidRequestError(f"Missing required parameter: '{name}'. Send it as a file field "
                                          "of a multipart/form-data body.", param=name)
            return None
        if len(files) > 1:
            raise InvalidRequestError(f"'{name}' must be one uploaded file; {len(files)} were sent.", param=name)
        return files[0]


class JsonForm(_Fields):
    """The same questions as Form, asked of OpenAI's JSON body form of a route that takes files:
    a file is a reference, ``{"image_url": "data:image/png;base64,..."}`` (or a list of them), and
    only data URLs can be read here: this server fetches no URL and does not read edits' images from
    its Files API."""

    def __init__(self, doc: dict[str, Any], files: dict[str, str]):
        self.doc = doc
        self.files = files   # file field -> JSON field

    def names(self) -> set[str]:
        return set(self.doc)

    def text(self, name: str) -> str | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (str, int, float)):
            return str(value)
        raise InvalidRequestError(f"'{name}' must be a string or a number.", param=name)

    def many(self, name: str) -> list[str] | None:
        value = self.doc.get(name)
        if value is None:
            return None
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            raise InvalidRequestError(f"'{name}' must be a list of strings.", param=name)
        return values

    def object(self, name: str) -> dict[str, Any] | str | None:
        value = self.doc.get(name)
        if value is not None and not isinstance(value, (dict, str)):
            raise InvalidRequestError(f"'{name}' must be a JSON object or a string.", param=name)
        return value

    async def file(self, name: str, *, required: bool, limit: int | None = None,
                   example: str = "file.bin") -> tuple[str | None, bytes] | None:
        field = self.files.get(name, name)
        ref = self.doc.get(field)
        if isinstance(ref, list):
            if len(ref) > 1:
                raise InvalidRequestError(f"'{field}' holds {len(ref)} images; this server edits one at a time.",
                                          param=field)
            ref = ref[0] if ref else None
        if ref is None:
            if required:
                raise InvalidRequestError(f"Missing required parameter: '{field}'. Send "
                                          f"[{{\"image_url\": \"data:image/png;base64,...\"}}].", param=field)
            return None
        if not isinstance(ref, dict):
            raise InvalidRequestError(f"'{field}' must hold objects like {{\"image_url\": \"data:...\"}}.", param=field)
        url = ref.get("image_url")
        if ref.get("file_id") is not None and url is None:
            raise InvalidRequestError(f"'{field}' refers to a file_id; image edits do not read images from the Files "
                                      "API. Send the image as a data URL in image_url, or as a multipart upload.",
                                      param=field)
        if not isinstance(url, str) or not url.startswith("data:"):
            raise InvalidRequestError(f"'{field}' must give the image as a data URL (data:image/png;base64,...); this "
                                      "server does not fetch URLs. Or send it as a multipart upload.", param=field)
        header, _, data = url.partition(",")
        if not header.endswith(";base64"):
            raise InvalidRequestError(f"The data URL in '{field}' must be base64 (data:image/png;base64,...).",
                                      param=field)
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            raise InvalidRequestError(f"The data URL in '{field}' is not valid base64.", param=field) from None
        if limit is not None and len(raw) > limit:
            raise RequestTooLargeError(f"The image is {len(raw) / 2 ** 20:.1f} MB, over the {limit / 2 ** 20:g} MB "
                                       "limit (max_upload_mb).", param=field, code="file_too_large")
        kind = header[5:].split(";", 1)[0]
        return f"{name}.{kind.split('/')[-1] or 'bin'}", raw


def form_schema(fields: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads a multipart form itself."""
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": required, "properties": fields}}}}}
