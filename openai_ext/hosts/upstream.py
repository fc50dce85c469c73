"""The upstream host: generation through another OpenAI-compatible engine (vLLM, SGLang,
llama-server, another instance of this server), with no model loaded here.

The server keeps doing everything above the host: validation, chat templates and tools (the
prompt is rendered with the upstream's own template, through its template route), grammars where
the upstream takes them, stop strings, token accounting, every API family and its stream framing.
The upstream only continues a prompt, given as token ids, through ``/v1/completions`` streamed.

Faults are answered, never waited on: an upstream that cannot be reached is a 503 within the
connect timeout, an upstream 4xx keeps its message and param, a 5xx or a stream cut short is a
502; a generation that is stopped (its client left) closes its connection, which the engines take
as a cancel. Connections are pooled, one pool per host, as large as the generations allowed at
once (``parallel``: more wait in this server's line, and get its 429 beyond it). When the
upstream comes back, the next request finds it: nothing here needs a restart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter

from ..core.errors import InvalidRequestError, OpenAIError, ServiceUnavailableError, UpstreamError
from .base import ChatPrompt, Host, HostAbilities, Piece, Pieces, Prompt, TokenLogprob
from .request import NO_CHAT_OPTIONS, ChatOptions, GenerationSettings
from .upstream_dialects import Dialect, detect, error_of

log = logging.getLogger(__name__)

CALL_TIMEOUT = 30.0   # seconds for a tokenizer or template call to answer

# Request fields the sampler names become on each kind of engine (the host samplers of a request).
SAMPLERS: dict[str, dict[str, str]] = {
    "llama.cpp": {"top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p", "top_n_sigma": "top_n_sigma",
                  "repetition_penalty": "repeat_penalty", "repetition_penalty_range": "repeat_last_n",
                  "xtc_threshold": "xtc_threshold", "xtc_probability": "xtc_probability",
                  "dry_multiplier": "dry_multiplier", "dry_base": "dry_base",
                  "dry_allowed_length": "dry_allowed_length", "mirostat_mode": "mirostat",
                  "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta", "ban_eos_token": "ignore_eos"},
    "vllm": {"top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
             "ban_eos_token": "ignore_eos"},
    "openai_ext": {"top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p",
                   "repetition_penalty": "repetition_penalty", "ban_eos_token": "ban_eos_token"},
    "generic": {},
}


def redact(url: str) -> str:
    """A URL as it may be logged or shown: without credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class UpstreamHost(Host):
    owned_by = "upstream"
    max_token_bytes = 256

    def __init__(self, url: str, *, api_key: str = "", model: str | None = None, parallel: int = 8,
                 connect_timeout: float = 3.0, read_timeout: float = 600.0, context: int = 0):
        self.root = url.rstrip("/").removesuffix("/v1")
        self.shown = redact(self.root)
        self.wanted = model
        self.model_id = model or "upstream"
        self.parallel = parallel
        self.timeouts = (connect_timeout, read_timeout)
        self.default_context = context or 4096
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=parallel + 4))
        self.session.mount("https://", HTTPAdapter(pool_connections=1, pool_maxsize=parallel + 4))
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.dialect: Dialect | None = None
        self._error: OpenAIError | None = None   # why the first contact failed
        self._probing = threading.Lock()
        self._stops: set[threading.Event] = set()
        self.abilities = self._abilities(None)
        self._try_probe()
        if self.dialect is None:
            log.warning("the upstream engine cannot serve yet (%s); requests are refused until it can",
                        self._error.message if self._error else "no answer")

    # talking to it -----------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            # A short read timeout: these calls (tokens, templates) are quick, and prompts are
            # prepared one at a time, so one that hangs must not hold up every request behind it.
            r = self.session.request(method, self.root + path, json=body, headers=self.headers,
                                     timeout=(self.timeouts[0], CALL_TIMEOUT))
        except (requests.ConnectionError, requests.Timeout) as e:
            raise self._unreachable(e) from None
        if r.status_code >= 400:
            raise self._refused(r.status_code, r.content)
        return r.json()

    def _unreachable(self, e: BaseException) -> ServiceUnavailableError:
        return ServiceUnavailableError(f"The upstream engine at {self.shown} cannot be reached "
                                       f"({type(e).__name__}); try again once it is up.",
                                       code="upstream_unavailable", headers={"Retry-After": "2"})

    def _refused(self, status: int, content: bytes) -> OpenAIError:
        message, param = error_of(content)
        if status == 429:
            return OpenAIError(f"The upstream engine is busy: {message}", status=429, code="rate_limit_exceeded",
                               headers={"Retry-After": "1"})
        if status in (401, 403):
            # the key is this server's setting, not the client's mistake
            return UpstreamError(f"The upstream engine at {self.shown} refused this server's key ({status}): "
                                 f"{message} Set upstream_api_key to a key it accepts.", code="upstream_auth",
                                 retry=False)
        if 400 <= status < 500:
            return InvalidRequestError(message, param=param, status=400 if status in (404, 405) else status)
        return UpstreamError(f"The upstream engine at {self.shown} failed ({status}): {message}",
                             code="upstream_error")

    def _probe(self) -> Dialect:
        """What the upstream serves; asked once, and again after it could not be reached."""
        with self._probing:
            if self.dialect is not None:
                return self.dialect
            models = self._call("GET", "/v1/models").get("data") or []
            ids = [m.get("id") for m in models if isinstance(m, dict)]
            if self.wanted is not None and self.wanted not in ids:
                served = ", ".join(map(str, ids)) or "no model"
                raise UpstreamError(f"The upstream engine at {self.shown} serves {served}, not '{self.wanted}'; set "
                                    "upstream_model to one of them.",
                                    code="upstream_model_not_found", retry=False)
            if not ids:
                raise UpstreamError(f"The upstream engine at {self.shown} serves no model yet.",
                                    code="upstream_model_not_found")
            self.model_id = self.wanted or str(ids[0])
            dialect = detect(self._call, models, self.model_id, self.default_context)
            self.abilities = self._abilities(dialect)
            self.dialect = dialect
            log.info("upstream: %s at %s, model %s, context %d tokens", dialect.name, self.shown, self.model_id,
                     dialect.context)
            return dialect

    def _abilities(self, dialect: Dialect | None) -> HostAbilities:
        names = frozenset(SAMPLERS.get(dialect.name, {}) if dialect else ())
        return HostAbilities(samplers=names, logprobs=dialect is not None and dialect.name != "generic",
                             prompt_logprobs=False, grammar=bool(dialect and dialect.grammar),
                             lazy_grammar=bool(dialect and dialect.lazy_grammar), parallel=self.parallel)

    @property
    def _known(self) -> Dialect:
        return self.dialect if self.dialect is not None else self._probe()

    # the contract --------------------------------------------------------------------------------
    def unavailable(self) -> Exception | None:
        """None once the upstream has answered: from then on a request finds a fault out itself,
        within the connect timeout, and is served as soon as the upstream is back. Before that
        (it was down when this server started), the upstream is asked again off the event loop,
        and the answer is why it cannot serve."""
        if self.dialect is not None:
            return None
        if not self._probing.locked():
            threading.Thread(target=self._try_probe, name="upstream-probe", daemon=True).start()
        return self._error or ServiceUnavailableError(f"The upstream engine at {self.shown} has not answered yet.",
                                                      code="upstream_unavailable", headers={"Retry-After": "2"})

    def _try_probe(self) -> None:
        try:
            self._probe()
        except OpenAIError as e:
            self._error = e

    def context_length(self) -> int:
        return self.dialect.context if self.dialect is not None else self.default_context

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        dialect = self._known
        known = dialect.recall(text, add_bos)
        return list(known) if known is not None else dialect.tokenize(self._call, self.model_id, text, add_bos)

    def detokenize(self, tokens: list[int]) -> str:
        return self._known.detokenize(self._call, self.model_id, tokens)

    def chat_prompt(self, messages: list[dict[str, Any]], options: ChatOptions = NO_CHAT_OPTIONS) -> ChatPrompt:
        return ChatPrompt(self._known.chat_prompt(self._call, self.model_id, messages))

    def _body(self, prompt: Prompt, s: GenerationSettings) -> dict[str, Any]:
        """The engine's /v1/completions body. Temperature 0 is greedy on every engine; a sampler
        left to a web UI preset (None) is the engine's default, as there is no preset here."""
        dialect = self._known
        body: dict[str, Any] = {
            "model": self.model_id, "prompt": prompt.tokens if dialect.exact_tokens else prompt.text,
            "max_tokens": s.max_new_tokens, "temperature": 1.0 if s.temperature is None else s.temperature,
            "top_p": 1.0 if s.top_p is None else s.top_p, "stream": True}
        if s.frequency_penalty:
            body["frequency_penalty"] = s.frequency_penalty
        if s.presence_penalty:
            body["presence_penalty"] = s.presence_penalty
        if s.seed is not None and s.seed >= 0:
            body["seed"] = s.seed
        if s.logprobs is not None:
            body["logprobs"] = max(1, s.logprobs)   # one at least, so every token comes with its own
        for ours, theirs in SAMPLERS.get(dialect.name, {}).items():
            if ours in s.samplers:
                body[theirs] = s.samplers[ours]
        if s.grammar and dialect.grammar:
            body.update(dialect.grammar_fields(s.grammar, list(s.grammar_triggers)))
        return body

    def generate(self, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event) -> Pieces:
        if settings.max_new_tokens <= 0:
            yield Piece("", tokens=0, finish_reason="length")
            return
        body = self._body(prompt, settings)
        top = settings.logprobs
        try:
            r = self.session.post(self.root + "/v1/completions", json=body, headers=self.headers,
                                  timeout=self.timeouts, stream=True)
        except (requests.ConnectionError, requests.Timeout) as e:
            raise self._unreachable(e) from None
        self._stops.add(stop_event)
        # Closing the response closes its connection: the engine sees the client gone and stops.
        with contextlib.closing(r):
            try:
                if r.status_code >= 400:
                    raise self._refused(r.status_code, r.content)
                yield from self._pieces(r, stop_event, top)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
                raise UpstreamError(f"The upstream engine at {self.shown} ended the stream early "
                                    f"({type(e).__name__}).", code="upstream_error") from None
            finally:
                self._stops.discard(stop_event)

    def _pieces(self, r: requests.Response, stop_event: threading.Event, top: int | None) -> Iterator[Piece]:
        for raw in _lines(r):
            if stop_event.is_set():
                return
            if not raw.startswith(b"data:"):
                continue
            data = raw[5:].strip()
            if data == b"[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:
                message, _ = error_of(data)
                raise UpstreamError(f"The upstream engine at {self.shown} failed while generating: {message}",
                                    code="upstream_error")
            for choice in chunk.get("choices") or []:
                text = choice.get("text") or ""
                finish = choice.get("finish_reason")
                entries = _logprobs(choice.get("logprobs"), top) if top is not None else []
                if entries and "".join(e.token for e in entries) == text:
                    for e in entries[:-1]:
                        yield Piece(e.token, tokens=1, logprob=e)
                    last = entries[-1]
                    yield Piece(last.token, tokens=1, logprob=last,
                                finish_reason=_finish(finish))
                elif text or finish:
                    # The engine's chunks are not tokens: the reply's tokens are counted at its end.
                    yield Piece(text, tokens=None, finish_reason=_finish(finish))
                if finish:
                    return

    def stop_all(self) -> None:
        for event in list(self._stops):
            event.set()

    def close(self) -> None:
        self.session.close()

    def describe(self) -> dict[str, Any]:
        dialect = self.dialect
        return {"model_name": self.model_id, "lora_names": [], "loader": "upstream", "upstream": self.shown,
                "engine": dialect.name if dialect else None, "n_ctx": self.context_length(),
                "parallel": self.parallel, "token_counts": "exact" if dialect and dialect.exact_tokens else "estimated"}


def _lines(r: requests.Response) -> Iterator[bytes]:
    """The stream's lines as the bytes arrive (a fixed read size would wait for the next token)."""
    pending = b""
    for data in r.iter_content(chunk_size=None):
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r")
    if pending:
        yield pending


def _finish(reason: str | None) -> str | None:
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"


def _logprobs(lp: Any, top: int) -> list[TokenLogprob]:
    """A chunk's log-probabilities, in OpenAI's legacy completions shape (vLLM, this server) or in
    the chat shape llama-server uses for completions too; ``top`` alternatives each at most."""
    if not isinstance(lp, dict):
        return []
    if isinstance(lp.get("content"), list):
        return [TokenLogprob(e["token"], float(e["logprob"]), e.get("bytes"),
                             [(t["token"], float(t["logprob"]), t.get("bytes"))
                              for t in (e.get("top_logprobs") or [])[:top]])
                for e in lp["content"]]
    tokens, lps = lp.get("tokens") or [], lp.get("token_logprobs") or []
    tops: list[Any] = lp.get("top_logprobs") or [None] * len(tokens)
    out = []
    for tok, value, alt in zip(tokens, lps, tops):
        alts = sorted((alt or {}).items(), key=lambda kv: -kv[1])
        out.append(TokenLogprob(tok, float(value if value is not None else 0.0), None,
                                [(t, float(v), None) for t, v in alts[:top]]))
    return out
