"""The upstream host: generation through another OpenAI-compatible engine (vLLM, SGLang,
llama-server, another instance of this server), with no model loaded here.

The server keeps doing everything above the host: validation, chat templates and tools (the
prompt is rendered with the upstream's own template, through its template route), grammars where
the upstream takes them, stop strings, token accounting, every API family and its stream framing.
The upstream only continues a prompt, given as token ids, through ``/v1/completions`` streamed.

Faults are answered, never waited on, and named as the upstream's: an upstream that cannot be
reached is a 503 within the connect timeout; one that does not begin its answer within the
first-byte timeout, or goes silent mid-stream past the idle timeout, a 504 (upstream_timeout); an
upstream 4xx keeps its message and param; a 5xx, a malformed or cut stream, a body that is not a
stream, a 502 (upstream_error; see upstream/stream.py). A generation that is stopped (its client
left) is cut at once, even while it waits for the upstream's headers, and its connection closed,
which the engines take as a cancel (upstream_calls.py). After a few faults in a row, requests are
refused at once until the upstream answers again (upstream/breaker.py). Connections are pooled,
one pool per host, as large as the generations allowed at once (``parallel``: more wait in this
server's line, and get its 429 beyond it). Nothing here needs a restart when the upstream is back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3
from urllib3.exceptions import ReadTimeoutError

from ...core.errors import InvalidRequestError, OpenAIError, ServiceUnavailableError, UpstreamError
from ..base import ChatPrompt, Host, HostAbilities, Piece, Pieces, Prompt
from ..request import NO_CHAT_OPTIONS, ChatOptions, GenerationSettings
from . import calls as upstream_calls
from . import options
from .breaker import Breaker
from .calls import Call, Calls
from .dialects import Dialect, detect, error_of
from .stream import StreamFault, is_event_stream, not_a_stream, read_pieces

log = logging.getLogger(__name__)

CALL_TIMEOUT = 30.0   # seconds for a tokenizer or template call to answer
CHECK_TIMEOUT = 3.0   # seconds for the model list to answer a check of the upstream's health
HEAD_BYTES = 2048     # of a body that is not the stream asked for, read to quote it

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
                 connect_timeout: float = 3.0, first_byte_timeout: float = 60.0, idle_timeout: float = 60.0,
                 context: int = 0):
        self.root = url.rstrip("/").removesuffix("/v1")
        self.shown = redact(self.root)
        self.wanted = model
        self.model_id = model or "upstream"
        self.parallel = parallel
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.idle_timeout = idle_timeout
        self.default_context = context or 4096
        self.session = upstream_calls.session(parallel + 4)
        self.calls = Calls()
        self.breaker = Breaker(self.shown, self._check)
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.dialect: Dialect | None = None
        self._error: OpenAIError | None = None   # why the first contact failed
        self._probing = threading.Lock()
        self._stops: set[threading.Event] = set()
        self.abilities = self._abilities(None)
        self.breaker.check_once()   # the first contact: what the upstream serves
        if self.dialect is None:
            log.warning("the upstream engine cannot serve yet (%s); requests are refused until it can",
                        self._error.message if self._error else "no answer")

    # talking to it -----------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None, *, timeout: float = CALL_TIMEOUT) -> Any:
        """One quick call (a tokenizer, a template, the model list), its JSON answer. Its read
        timeout is short: prompts are prepared one at a time, so one that hangs must not hold up
        every request behind it for long."""
        try:
            r = self.session.request(method, self.root + path, json=body, headers=self.headers,
                                     timeout=(self.connect_timeout, timeout))
        except requests.RequestException as e:
            if _timed_out(e) and not isinstance(e, requests.ConnectTimeout):
                raise UpstreamError(f"The upstream engine at {self.shown} did not answer {path} within {timeout:g} s.",
                                    status=504, code="upstream_timeout") from None
            raise self._unreachable(e) from None
        if r.status_code >= 400:
            raise self._refused(r.status_code, r.content)
        try:
            return json.loads(r.content)
        except ValueError:
            raise UpstreamError(f"The upstream engine at {self.shown} answered {path} with a body that is not JSON "
                                f"({r.headers.get('Content-Type') or 'no Content-Type'}).",
                                code="upstream_error") from None

    def _ask(self, method: str, path: str, body: Any = None) -> Any:
        """A dialect's call while a request is prepared: a fault of the upstream counts toward
        the breaker (detect() asks through _call, where a failure is an answer)."""
        try:
            return self._call(method, path, body)
        except OpenAIError as e:
            self.breaker.failed(e)
            raise

    def _unreachable(self, e: BaseException) -> ServiceUnavailableError:
        return ServiceUnavailableError(f"The upstream engine at {self.shown} cannot be reached "
                                       f"({type(e).__name__}); try again once it is up.",
                                       code="upstream_unavailable", headers={"Retry-After": "2"})

    def _refused(self, status: int, content: bytes) -> OpenAIError:
        message, param = error_of(content)
        if self.api_key:   # an engine (or a proxy before it) that echoes the key must not show it
            message = message.replace(self.api_key, "***")
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
            found = self._call("GET", "/v1/models", timeout=CHECK_TIMEOUT)
            models = (found.get("data") if isinstance(found, dict) else None) or []
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
        return HostAbilities(samplers=options.takes(dialect.name if dialect else None),
                             logprobs=dialect is not None and dialect.name != "generic",
                             prompt_logprobs=False, grammar=bool(dialect and dialect.grammar),
                             lazy_grammar=bool(dialect and dialect.lazy_grammar), parallel=self.parallel)

    @property
    def _known(self) -> Dialect:
        return self.dialect if self.dialect is not None else self._probe()

    # the contract --------------------------------------------------------------------------------
    def unavailable(self) -> Exception | None:
        """Why requests are refused now, at once and before they take a place in line: the
        upstream has never answered (it is asked again, off the event loop), or the breaker is
        open after faults in a row. None otherwise: a request then finds a fault out itself,
        within the timeouts, and is served as soon as the upstream is back."""
        if self.dialect is None:
            self.breaker.check_soon()
            return self._error or ServiceUnavailableError(f"The upstream engine at {self.shown} has not answered "
                                                          "yet.", code="upstream_unavailable",
                                                          headers={"Retry-After": "2"})
        return self.breaker.refusal()

    def readiness(self) -> dict[str, Any]:
        """Whether the upstream can serve, for health checks: {"ready", "error" (what is wrong and
        what to do, or None), "upstream", "engine", "breaker" ("closed" or "open"), "failures" (in
        a row), "checked_ago" (seconds since the upstream was last checked)}. Never waits: it is
        what was last seen, and asking has the upstream checked again in the background when
        that is over a second old, so an idle server notices an upstream gone down."""
        state = self.breaker.state()
        if self.dialect is None:
            problem = self.unavailable()
            state.update(ready=False, error=str(problem) if problem is not None else None)
        return {**state, "upstream": self.shown, "engine": self.dialect.name if self.dialect else None}

    def _check(self) -> None:
        """Asks the upstream whether it answers; raises what it got if not (the breaker's check)."""
        if self.dialect is None:
            try:
                self._probe()
            except OpenAIError as e:
                self._error = e
                raise
        else:
            self._call("GET", "/v1/models", timeout=CHECK_TIMEOUT)

    def context_length(self) -> int:
        return self.dialect.context if self.dialect is not None else self.default_context

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        dialect = self._known
        known = dialect.recall(text, add_bos)
        return list(known) if known is not None else dialect.tokenize(self._ask, self.model_id, text, add_bos)

    def detokenize(self, tokens: list[int]) -> str:
        return self._known.detokenize(self._ask, self.model_id, tokens)

    def chat_prompt(self, messages: list[dict[str, Any]], options: ChatOptions = NO_CHAT_OPTIONS) -> ChatPrompt:
        return ChatPrompt(self._known.chat_prompt(self._ask, self.model_id, messages))

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
        body.update(options.engine_fields(dialect.name, s))
        if s.grammar and dialect.grammar:
            body.update(dialect.grammar_fields(s.grammar, list(s.grammar_triggers)))
        return body

    def generate(self, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event) -> Pieces:
        if settings.max_new_tokens <= 0:
            yield Piece("", tokens=0, finish_reason="length")
            return
        body = self._body(prompt, settings)
        self._stops.add(stop_event)
        try:
            with self.calls.track(stop_event, self.first_byte_timeout) as call:
                try:
                    yield from self._stream(call, body, stop_event, settings.logprobs)
                except (requests.RequestException, StreamFault) as e:
                    if stop_event.is_set() or call.reason == "stopped":
                        return   # the client left (its call was cut for that): nobody reads an error
                    error = self._fault(e, call)
                    self.breaker.failed(error)
                    raise error from None
                except OpenAIError as e:   # the upstream's own error answer (_refused)
                    self.breaker.failed(e)
                    raise
        finally:
            self._stops.discard(stop_event)

    def _stream(self, call: Call, body: dict[str, Any], stop_event: threading.Event, top: int | None) -> Pieces:
        # The socket's own read timeout only backs the watcher's deadlines up (upstream/calls.py).
        with call.sending():
            r = self.session.post(self.root + "/v1/completions", json=body, headers=self.headers, stream=True,
                                  timeout=(self.connect_timeout, max(self.first_byte_timeout, self.idle_timeout)))
        call.answered = True
        call.expect(self.idle_timeout)   # for the rest of an error or of a body that is not a stream
        # Closing the response closes its connection: the engine sees its client gone and stops.
        with contextlib.closing(r):
            if r.status_code >= 400:
                raise self._refused(r.status_code, r.content)
            kind = r.headers.get("Content-Type", "")
            if not is_event_stream(kind):
                raise not_a_stream(kind, next(r.iter_content(HEAD_BYTES), b""))
            yield from read_pieces(_lines(r, call, self.idle_timeout), stop_event, top)
        if not stop_event.is_set():
            self.breaker.succeeded()

    def _fault(self, e: Exception, call: Call) -> OpenAIError:
        """The error a failed generation answers with, naming the upstream."""
        if isinstance(e, requests.ConnectTimeout):
            return self._unreachable(e)
        if call.reason == "timeout" or _timed_out(e):
            if not call.answered:
                return UpstreamError(
                    f"The upstream engine at {self.shown} did not begin its answer within {self.first_byte_timeout:g} "
                    "s. Raise upstream_first_byte_timeout if it needs longer to start (a long prompt, a full batch).",
                    status=504, code="upstream_timeout")
            return UpstreamError(
                f"The upstream engine at {self.shown} went silent for {self.idle_timeout:g} s in the middle of its "
                "answer; the answer is incomplete. Raise upstream_idle_timeout if it pauses longer between tokens.",
                status=504, code="upstream_timeout")
        if isinstance(e, StreamFault):
            return UpstreamError(f"The upstream engine at {self.shown} {e}", code="upstream_error")
        if not call.answered:
            return self._unreachable(e)   # refused, or closed before it answered
        return UpstreamError(f"The upstream engine at {self.shown} ended the stream early ({type(e).__name__}); "
                             "the answer is incomplete.", code="upstream_error")

    def stop_all(self) -> None:
        for event in list(self._stops):
            event.set()

    def close(self) -> None:
        self.breaker.close()
        self.calls.close()
        self.session.close()

    def describe(self) -> dict[str, Any]:
        dialect = self.dialect
        return {"model_name": self.model_id, "lora_names": [], "loader": "upstream", "upstream": self.shown,
                "engine": dialect.name if dialect else None, "n_ctx": self.context_length(),
                "parallel": self.parallel, "token_counts": "exact" if dialect and dialect.exact_tokens else "estimated"}


def _reads(r: requests.Response) -> Iterator[bytes]:
    """The body as it arrives. A chunked body comes chunk by chunk; one that is not (its end is
    where the connection closes) is read as it comes too, whatever is there at each read, where
    iter_content would wait for its end."""
    read1 = getattr(r.raw, "read1", None)   # (urllib3 2.3 and later)
    if r.raw.chunked or read1 is None:
        yield from r.iter_content(chunk_size=None)
        return
    while True:
        try:
            data = read1(65536)
        except urllib3.exceptions.HTTPError as e:   # as iter_content reports it
            raise requests.ConnectionError(e) from None
        if not data:
            return
        yield data


def _lines(r: requests.Response, call: Call, idle: float) -> Iterator[bytes]:
    """The stream's lines as the bytes arrive (a fixed read size would wait for the next token).
    The upstream has ``idle`` seconds for each read; none while the lines read are handed on."""
    chunks = _reads(r)
    pending = b""
    while True:
        call.expect(idle)
        data = next(chunks, None)
        call.expect(None)
        if data is None:
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r")
    if pending:
        yield pending


def _timed_out(e: BaseException) -> bool:
    """A read that timed out (requests wraps one in the middle of a body in a ConnectionError)."""
    return isinstance(e, requests.Timeout) or any(isinstance(a, ReadTimeoutError) for a in e.args)
