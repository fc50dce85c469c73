"""Test double of vLLM's OpenAI-compatible server, for the calls the upstream host makes.

vLLM needs a GPU (or a CPU build that does not install here), so the routes the upstream host
uses are served as vLLM serves them (vllm/entrypoints/openai/api_server.py and serving_tokenization.py):
  GET  /v1/models      {"object": "list", "data": [{"id", "object": "model", "max_model_len", ...}]}
  POST /tokenize       {"model", "prompt", "add_special_tokens"} or {"model", "messages",
                       "add_generation_prompt", "add_special_tokens"} -> {"tokens", "count", "max_model_len"}
  POST /detokenize     {"model", "tokens"} -> {"prompt"}
  POST /v1/completions OpenAI's body plus vLLM's extra sampling fields (top_k, min_p,
                       repetition_penalty, ignore_eos, structured_outputs {"grammar": ...}); streamed as
                       OpenAI's SSE with legacy log-probabilities ({tokens, token_logprobs, top_logprobs})
and refuses what vLLM refuses: an unknown model is a 404 in OpenAI's error shape, an unknown field
a 400 (vLLM's request models forbid extra fields).

Where it is not vLLM: the tokens come from the embedded SmolLM2 (the ``inner`` API server, an
instance of this project on the real model), generation is that server's, and the grammar is
llama.cpp's GBNF (vLLM's xgrammar takes the same GBNF for the grammars the upstream host sends).
No GPU, batching or paged attention is modelled.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "stream", "stream_options", "seed",
                     "logprobs", "stop", "frequency_penalty", "presence_penalty", "top_k", "min_p",
                     "repetition_penalty", "ignore_eos", "structured_outputs", "n", "echo", "user"}


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


def app(host: Any, inner_url: str, *, context: int = 2048) -> FastAPI:
    """``host``: the embedded host (its tokenizer and template); ``inner_url``: an API server on it."""
    api = FastAPI()
    api.state.requests = []

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "vllm",
                                            "root": MODEL, "parent": None, "max_model_len": context}]}

    @api.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        if body.get("model") != MODEL:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "model")
        if "messages" in body:
            text = host.chat_prompt(body["messages"]).text
            tokens = host.tokenize(text, add_bos=bool(body.get("add_special_tokens", False)))
        else:
            tokens = host.tokenize(body["prompt"], add_bos=bool(body.get("add_special_tokens", True)))
        return {"tokens": tokens, "count": len(tokens), "max_model_len": context}

    @api.post("/detokenize")
    async def detokenize(request: Request):
        body = await request.json()
        return {"prompt": host.detokenize(body["tokens"])}

    @api.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        api.state.requests.append(body)
        extra = set(body) - COMPLETION_FIELDS
        if extra:
            return _error(400, f"Extra inputs are not permitted: {sorted(extra)[0]}", sorted(extra)[0])
        if body.get("model") != MODEL:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "model")
        inner = {k: v for k, v in body.items() if k not in ("structured_outputs", "ignore_eos", "model")}
        inner["model"] = "x"
        if body.get("ignore_eos"):
            inner["ban_eos_token"] = True
        grammar = (body.get("structured_outputs") or {}).get("grammar")
        if grammar:
            inner["grammar_string"] = grammar
        client = httpx.AsyncClient(timeout=600)
        upstream = await client.send(client.build_request("POST", f"{inner_url}/completions", json=inner),
                                     stream=True)
        if upstream.status_code != 200:
            content = await upstream.aread()
            await client.aclose()
            return JSONResponse(json.loads(content), status_code=upstream.status_code)

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        return StreamingResponse(relay(), media_type="text/event-stream")

    return api
