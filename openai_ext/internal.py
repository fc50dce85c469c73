"""/v1/internal/*: tokens, model info and model management, in the shapes of the web UI's own API.

Model and LoRA management needs the admin key (admin_key, or the api_key when it is unset)."""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field, StrictInt

from . import chat, tools
from .auth import require_admin
from .errors import InvalidRequestError, NotImplementedByServer
from .protocol import ChatCompletionRequest

router = APIRouter(prefix="/internal")
admin = [Depends(require_admin)]


class EncodeRequest(BaseModel):
    text: str


class DecodeRequest(BaseModel):
    tokens: list[StrictInt]


class LoadModelRequest(BaseModel):
    model_name: str = Field(min_length=1)
    args: dict[str, Any] | None = None


class LoadLorasRequest(BaseModel):
    lora_names: list[str]


def _state(request: Request):
    return request.app.state.api


def _manager(request: Request):
    manager = _state(request).manager
    if manager is None:
        raise NotImplementedByServer("This server was started without model management.")
    return manager


@router.post("/encode")
async def encode(body: EncodeRequest, request: Request):
    tokens = _state(request).host.tokenize(body.text)
    return {"tokens": tokens, "length": len(tokens)}


@router.post("/decode")
async def decode(body: DecodeRequest, request: Request):
    host = _state(request).host
    vocab = host.abilities.vocab_size
    bad = [t for t in body.tokens if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        raise InvalidRequestError(f"Token id {bad[0]} is not in the loaded model's vocabulary.", param="tokens")
    return {"text": host.detokenize(body.tokens)}


@router.post("/token-count")
async def token_count(body: EncodeRequest, request: Request):
    return {"length": len(_state(request).host.tokenize(body.text))}


@router.post("/chat-prompt")
async def chat_prompt(body: ChatCompletionRequest, request: Request):
    """The prompt a chat request would be rendered into, without generating."""
    host = _state(request).host
    toolset = tools.parse(body)
    messages, tools_arg = tools.for_template(chat.normalize_messages(body), toolset,
                                             native=tools.template_is_native(host.chat_template))
    return {"prompt": host.chat_prompt(messages, {"tools": tools_arg} if tools_arg else {}).text}


@router.post("/stop-generation")
async def stop_generation(request: Request):
    _state(request).host.stop_all()
    return "OK"


@router.get("/model/info")
async def model_info(request: Request):
    return _state(request).host.describe()


@router.get("/model/list", dependencies=admin)
async def model_list(request: Request):
    return {"model_names": _manager(request).list()}


async def _swap(request: Request, change) -> str:
    """Runs a model change while no generation runs (it takes its turn in the queue), then
    serves with the host it returns."""
    state = _state(request)
    async with state.queue.admit():
        new = await state.queue.run(change, state.host)
        old, state.host = state.host, new
        if new is not old:
            with contextlib.suppress(Exception):
                old.close()
    return "OK"


@router.post("/model/load", dependencies=admin)
async def model_load(body: LoadModelRequest, request: Request):
    manager = _manager(request)
    return await _swap(request, lambda current: manager.load(body.model_name, body.args, current))


@router.post("/model/unload", dependencies=admin)
async def model_unload(request: Request):
    manager = _manager(request)
    return await _swap(request, manager.unload)


@router.get("/lora/list", dependencies=admin)
async def lora_list(request: Request):
    return {"lora_names": _manager(request).loras()}


@router.post("/lora/load", dependencies=admin)
async def lora_load(body: LoadLorasRequest, request: Request):
    manager = _manager(request)
    state = _state(request)
    async with state.queue.admit():
        await state.queue.run(manager.load_loras, body.lora_names)
    return "OK"


@router.post("/lora/unload", dependencies=admin)
async def lora_unload(request: Request):
    manager = _manager(request)
    state = _state(request)
    async with state.queue.admit():
        await state.queue.run(manager.unload_loras)
    return "OK"
