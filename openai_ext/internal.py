"""/v1/internal/*: tokens, model info and model management, in the shapes of the web UI's own API.

Model and LoRA management needs the admin key (admin_key, or the api_key when it is unset)."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field, StrictInt

from . import chat, tools
from .auth import require_admin
from .errors import InvalidRequestError, NotImplementedByServer, ServiceUnavailableError
from .model_manager import ModelChangeFailed, NoModel
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


def _loaded_host(request: Request):
    """The host, for the tokenizer routes: without a model there is no tokenizer (the web UI's own
    encode would fail with a 500)."""
    host = _state(request).host
    if not host.loaded:
        raise ServiceUnavailableError("No model is loaded, so there is no tokenizer. Load a model first.",
                                      code="model_not_loaded")
    return host


async def _tokenizer_work(request: Request, fn, *args):
    """Runs a tokenizer call as chat requests are prepared: on a worker thread, one at a time
    (a tokenizer may not be shared between threads), so a long text, or the web UI reloading an
    idle model, never holds up the event loop."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=_state(request).limiter("prepare"))


@router.post("/encode")
async def encode(body: EncodeRequest, request: Request):
    tokens = await _tokenizer_work(request, _loaded_host(request).tokenize, body.text)
    return {"tokens": tokens, "length": len(tokens)}


@router.post("/decode")
async def decode(body: DecodeRequest, request: Request):
    host = _loaded_host(request)
    vocab = host.abilities.vocab_size
    bad = [t for t in body.tokens if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        raise InvalidRequestError(f"Token id {bad[0]} is not in the loaded model's vocabulary.", param="tokens")
    return {"text": await _tokenizer_work(request, host.detokenize, body.tokens)}


@router.post("/token-count")
async def token_count(body: EncodeRequest, request: Request):
    return {"length": len(await _tokenizer_work(request, _loaded_host(request).tokenize, body.text))}


@router.post("/chat-prompt")
async def chat_prompt(body: ChatCompletionRequest, request: Request):
    """The prompt a chat request would be rendered into, without generating."""
    host = _state(request).host
    toolset = tools.parse(body)
    messages, tools_arg = tools.for_template(chat.normalize_messages(body), toolset,
                                             native=tools.template_is_native(host.chat_template))
    rendered = await _tokenizer_work(request, host.chat_prompt, messages, {"tools": tools_arg} if tools_arg else {})
    return {"prompt": rendered.text}


@router.post("/stop-generation", dependencies=admin)   # it stops other users' generations too
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
    """Runs a model change while no generation runs (it takes its turn in the queue) and no prompt
    is being prepared, then serves with the host it returns.

    While it runs, a placeholder serves: generations and tokenizer routes answer 503 rather than
    reach a model that is being closed. The change is shielded from cancellation: a client that
    goes away must not leave the placeholder serving once the load is done."""
    state = _state(request)
    async with state.queue.admit(), state.limiter("prepare"):
        old = state.host
        state.host = NoModel(old.describe().get("loader"), code="model_changing",
                             message="The model is being changed; retry in a moment.")
        with anyio.CancelScope(shield=True):
            try:
                state.host = await state.queue.run(change, old)
            except ModelChangeFailed as e:
                state.host = e.serving
                raise
            except BaseException:
                state.host = old   # refused before anything changed (a bad name or args)
                raise
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
