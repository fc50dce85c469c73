"""The server's own surface: /v1/models, and /v1/internal/* (tokens, model info and model
management) in the shapes of the web UI's own API.

Model and LoRA management needs the admin key (admin_key, or the api_key when it is unset)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from fastapi import APIRouter, Depends, Request
from pydantic import Field, StrictInt

from ..core.api_model import ApiModel
from ..core.auth import require_admin
from ..core.catalog import Catalog
from ..core.errors import (
    InvalidRequestError,
    NotImplementedByServer,
    ServiceUnavailableError,
)
from ..hosts.base import Host
from ..hosts.manager import ModelManager
from ..text import chat, params, tools
from ..text.protocol import ChatCompletionRequest, CompletionRequest
from ..text.service import TextService, admit

# Text tokenized by one /internal/encode or /internal/token-count call at most: a third of a second of
# the tokenizer's time on a small CPU at worst, during which other requests' prompts wait.
MAX_TOKENIZE_CHARS = 262_144


class EncodeRequest(ApiModel):
    text: str = Field(max_length=MAX_TOKENIZE_CHARS)


class DecodeRequest(ApiModel):
    tokens: list[StrictInt]


class LoadModelRequest(ApiModel):
    model_name: str = Field(min_length=1)
    args: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None   # the web UI's own field: taken, as before, and not applied


class LoadLorasRequest(ApiModel):
    lora_names: list[str]


class LogitsRequest(ApiModel):
    """The web UI's LogitsRequest: a prompt, and the generation fields of a completion request
    (used with use_samplers), which pass here to be read as a CompletionRequest."""
    passes = frozenset({*CompletionRequest.model_fields, *CompletionRequest.passes})
    elsewhere = CompletionRequest.elsewhere
    hinted = (*CompletionRequest.model_fields, *CompletionRequest.hinted)
    prompt: str
    use_samplers: bool = False
    top_logits: int = Field(50, ge=1, le=1000)


class ModelListing(Protocol):
    """Another API's view of /v1/models, for the requests that carry its ``header`` (Anthropic's
    clients send anthropic-version with every request and list models at the same path)."""
    header: str

    def list(self, query: dict[str, str]) -> dict[str, Any]: ...

    def retrieve(self, model_id: str) -> dict[str, Any]: ...


def models_router(catalog: Catalog, listings: Sequence[ModelListing] = ()) -> APIRouter:
    r = APIRouter()

    def listing(request: Request) -> ModelListing | None:
        return next((v for v in listings if request.headers.get(v.header) is not None), None)

    @r.get("/models")
    async def list_models(request: Request):
        other = listing(request)
        if other is not None:
            return other.list(dict(request.query_params))
        return {"object": "list", "data": catalog.cards()}

    @r.get("/models/{model_id:path}")
    async def retrieve_model(model_id: str, request: Request):
        other = listing(request)
        if other is not None:
            return other.retrieve(model_id)
        return catalog.retrieve(model_id)

    return r


def internal_router(text: TextService, manager: ModelManager | None) -> APIRouter:
    r = APIRouter(prefix="/internal")
    admin = [Depends(require_admin(text.settings))]

    def managed() -> ModelManager:
        if manager is None:
            raise NotImplementedByServer("This server was started without model management.")
        return manager

    def loaded_host() -> Host:
        """The host, for the tokenizer routes: without a model there is no tokenizer (the web UI's
        own encode would fail with a 500)."""
        if not text.host.loaded:
            raise ServiceUnavailableError("No model is loaded, so there is no tokenizer. Load a model first.",
                                          code="model_not_loaded")
        problem = text.host.unavailable()
        if problem is not None:
            raise problem
        return text.host

    @r.post("/encode")
    async def encode(body: EncodeRequest):
        tokens = await text.tokenizer_work(loaded_host().tokenize, body.text)
        return {"tokens": tokens, "length": len(tokens)}

    @r.post("/decode")
    async def decode(body: DecodeRequest):
        host = loaded_host()
        vocab = host.abilities.vocab_size
        bad = [t for t in body.tokens if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise InvalidRequestError(f"Token id {bad[0]} is not in the loaded model's vocabulary.", param="tokens")
        return {"text": await text.tokenizer_work(host.detokenize, body.tokens)}

    @r.post("/token-count")
    async def token_count(body: EncodeRequest):
        return {"length": len(await text.tokenizer_work(loaded_host().tokenize, body.text))}

    @r.post("/chat-prompt")
    async def chat_prompt(body: ChatCompletionRequest):
        """The prompt a chat request would be rendered into, without generating."""
        host = text.host
        given = chat.template_input(host, body, tools.parse(body))
        rendered = await text.tokenizer_work(given.render, host)
        # The tokens too: a server in front of this one (an upstream host) needs both.
        tokens = await text.tokenizer_work(host.tokenize, rendered.text)
        return {"prompt": rendered.text, "tokens": tokens}

    @r.post("/logits")
    async def logits(body: LogitsRequest):
        """The next token's most likely candidates with their probabilities, as the web UI's
        own API returns them: {"logits": {token: probability}}."""
        host = loaded_host()

        def prepare() -> params.Plan:
            fields = {"max_tokens": 1, **(body.model_extra or {}), "prompt": body.prompt}
            request = CompletionRequest.model_validate(fields)
            return params.plan(request, abilities=host.abilities, room=1, max_n=1)

        # the front door, as every text request: in line with generations (without samplers it
        # takes the model too), the request planned on the prepare thread
        plan, place = await admit(text, prepare)
        async with place:
            try:
                found = await text.run(host.next_token_probabilities, body.prompt, plan.settings,
                                       body.use_samplers, body.top_logits)
            except NotImplementedError:
                raise NotImplementedByServer("The loaded model's backend cannot report next-token "
                                             "probabilities.") from None
        return {"logits": found}

    @r.post("/stop-generation", dependencies=admin)   # it stops other users' generations too
    async def stop_generation():
        text.host.stop_all()
        for host in text.lanes.hosts() if text.lanes is not None else []:
            host.stop_all()
        return "OK"

    @r.get("/model/info")
    async def model_info():
        info = text.host.describe()
        if text.lanes is not None:   # standalone's other models, loaded on demand by name
            info["loaded_models"] = text.lanes.describe()
        return info

    @r.get("/model/list", dependencies=admin)
    async def model_list():
        return {"model_names": managed().list()}

    @r.post("/model/load", dependencies=admin)
    async def model_load(body: LoadModelRequest):
        m = managed()
        await text.change_model(lambda current: m.load(body.model_name, body.args, current))
        return "OK"

    @r.post("/model/unload", dependencies=admin)
    async def model_unload():
        await text.change_model(managed().unload)
        return "OK"

    @r.get("/lora/list", dependencies=admin)
    async def lora_list():
        return {"lora_names": managed().loras()}

    @r.post("/lora/load", dependencies=admin)
    async def lora_load(body: LoadLorasRequest):
        m = managed()
        async with text.exclusive():
            await text.run(m.load_loras, body.lora_names)
        return "OK"

    @r.post("/lora/unload", dependencies=admin)
    async def lora_unload():
        m = managed()
        async with text.exclusive():
            await text.run(m.unload_loras)
        return "OK"

    return r
