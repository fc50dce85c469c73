"""What each kind of upstream engine offers beside OpenAI's routes, and how to ask for it.

Every OpenAI-compatible engine serves ``/v1/models`` and ``/v1/completions``; what differs is the
rest this server needs to keep its own validation, tool calling and token accounting: the model's
context length, a tokenizer, the chat template, and a way to constrain decoding with a grammar.

- ``openai_ext``: another instance of this server (``/v1/internal/model/info``, ``encode``,
  ``decode``, ``chat-prompt``, and the web UI API's ``grammar_string``; no lazy grammars, so a
  call the model opens by itself is validated, not enforced).
- ``llama.cpp``: llama-server (``/props``, ``/tokenize``, ``/detokenize``, ``/apply-template``,
  GBNF ``grammar`` with lazy triggers).
- ``vllm``: vLLM, and SGLang's vLLM-compatible routes (``max_model_len`` on ``/v1/models``,
  ``/tokenize`` with messages for the template, ``/detokenize``, ``structured_outputs.grammar``).
- ``generic``: anything else. Token counts are estimates (4 bytes a token) and prompts are
  rendered in ChatML; the README says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

# (method, path, body) -> parsed JSON body; raises on transport errors and non-2xx answers
Call = Callable[[str, str, Any], Any]


@dataclass
class Dialect:
    name: str
    context: int
    grammar: bool = False
    lazy_grammar: bool = False
    exact_tokens: bool = True
    # The last rendered prompt's tokens, when rendering gave them: the prompt is tokenized next,
    # and an upstream round trip is saved (the prompt is prepared one at a time).
    rendered: tuple[str, list[int]] | None = None

    def remember(self, text: str, tokens: list[int] | None) -> str:
        self.rendered = (text, tokens) if tokens is not None else None
        return text

    def recall(self, text: str, add_bos: bool) -> list[int] | None:
        if add_bos and self.rendered is not None and self.rendered[0] == text:
            return self.rendered[1]
        return None

    def tokenize(self, call: Call, model: str, text: str, add_bos: bool) -> list[int]:
        raise NotImplementedError

    def detokenize(self, call: Call, model: str, tokens: list[int]) -> str:
        raise NotImplementedError

    def chat_prompt(self, call: Call, model: str, messages: list[dict[str, Any]]) -> str:
        raise NotImplementedError

    def grammar_fields(self, gbnf: str, triggers: list[str]) -> dict[str, Any]:
        return {}


class OurServer(Dialect):
    start: list[int] | None = None   # what an empty document encodes to (its BOS), asked once

    def tokenize(self, call: Call, model: str, text: str, add_bos: bool) -> list[int]:
        tokens = call("POST", "/v1/internal/encode", {"text": text})["tokens"]
        if not add_bos:
            if self.start is None:
                self.start = call("POST", "/v1/internal/encode", {"text": ""})["tokens"]
            start = self.start
            if start and tokens[:len(start)] == start:
                tokens = tokens[len(start):]
        return tokens

    def detokenize(self, call: Call, model: str, tokens: list[int]) -> str:
        return call("POST", "/v1/internal/decode", {"tokens": tokens})["text"]

    def chat_prompt(self, call: Call, model: str, messages: list[dict[str, Any]]) -> str:
        found = call("POST", "/v1/internal/chat-prompt", {"model": model, "messages": messages})
        return self.remember(found["prompt"], found.get("tokens"))

    def grammar_fields(self, gbnf: str, triggers: list[str]) -> dict[str, Any]:
        return {} if triggers else {"grammar_string": gbnf}   # the web UI API's field


class LlamaServer(Dialect):
    def tokenize(self, call: Call, model: str, text: str, add_bos: bool) -> list[int]:
        return call("POST", "/tokenize", {"content": text, "add_special": add_bos})["tokens"]

    def detokenize(self, call: Call, model: str, tokens: list[int]) -> str:
        return call("POST", "/detokenize", {"tokens": tokens})["content"]

    def chat_prompt(self, call: Call, model: str, messages: list[dict[str, Any]]) -> str:
        return call("POST", "/apply-template", {"messages": messages})["prompt"]

    def grammar_fields(self, gbnf: str, triggers: list[str]) -> dict[str, Any]:
        if triggers:
            return {"grammar": gbnf, "grammar_lazy": True,
                    "grammar_triggers": [{"type": 1, "value": t} for t in triggers]}   # 1: a word
        return {"grammar": gbnf}


class Vllm(Dialect):
    def tokenize(self, call: Call, model: str, text: str, add_bos: bool) -> list[int]:
        return call("POST", "/tokenize", {"model": model, "prompt": text, "add_special_tokens": add_bos})["tokens"]

    def detokenize(self, call: Call, model: str, tokens: list[int]) -> str:
        return call("POST", "/detokenize", {"model": model, "tokens": tokens})["prompt"]

    def chat_prompt(self, call: Call, model: str, messages: list[dict[str, Any]]) -> str:
        tokens = call("POST", "/tokenize", {"model": model, "messages": messages, "add_generation_prompt": True,
                                            "add_special_tokens": False})["tokens"]
        return self.remember(self.detokenize(call, model, tokens), tokens)

    def grammar_fields(self, gbnf: str, triggers: list[str]) -> dict[str, Any]:
        return {} if triggers else {"structured_outputs": {"grammar": gbnf}}


class Generic(Dialect):
    """No tokenizer and no template to ask for: estimates, and ChatML."""

    def tokenize(self, call: Call, model: str, text: str, add_bos: bool) -> list[int]:
        return [0] * (len(text.encode()) // 4 + (1 if text else 0))

    def detokenize(self, call: Call, model: str, tokens: list[int]) -> str:
        return ""

    def chat_prompt(self, call: Call, model: str, messages: list[dict[str, Any]]) -> str:
        out = [f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages]
        return "".join(out) + "<|im_start|>assistant\n"


def detect(call: Call, models: list[dict[str, Any]], model: str, default_context: int) -> Dialect:
    """Asks the upstream what it is, from the routes only one kind serves."""
    try:
        info = call("GET", "/v1/internal/model/info", None)
        if isinstance(info, dict) and "model_name" in info:
            return OurServer("openai_ext", int(info.get("n_ctx") or default_context), grammar=True)
    except Exception:   # noqa: BLE001 - any failure means: not this kind
        pass
    try:
        props = call("GET", "/props", None)
        settings = props.get("default_generation_settings") if isinstance(props, dict) else None
        if isinstance(settings, dict):
            return LlamaServer("llama.cpp", int(settings.get("n_ctx") or default_context), grammar=True,
                               lazy_grammar=True)
    except Exception:   # noqa: BLE001
        pass
    card = next((m for m in models if m.get("id") == model), models[0] if models else {})
    if card.get("max_model_len"):
        return Vllm("vllm", int(card["max_model_len"]), grammar=True)
    return Generic("generic", default_context, exact_tokens=False)


def error_of(body: bytes) -> tuple[str, str | None]:
    """An upstream error's message and param, from OpenAI's error shape or llama-server's."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:500] or "no message", None
    err = data.get("error", data) if isinstance(data, dict) else {}
    if isinstance(err, str):
        return err, None
    message = err.get("message") or data.get("detail") or "no message"
    param = err.get("param") if isinstance(err.get("param"), str) else None
    return str(message), param
