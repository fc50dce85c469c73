"""Reading an upstream's ``/v1/completions`` stream into pieces, and telling a broken one apart.

A stream that does not follow the format is the upstream's fault, never the model's, and never a
finished answer: a chunk that is not JSON or not a completion chunk, an error object in place of a
chunk, a body that is not an event stream at all (an HTML page, a JSON completion where a stream
was asked for), and a stream that ends with neither a ``finish_reason`` nor ``data: [DONE]`` (the
connection closed in the middle of the answer) each raise ``StreamFault``, saying what was wrong,
which the host turns into an error that names the upstream.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Generator, Iterable, Iterator

from ..base import Piece, TokenLogprob
from .dialects import error_of

SHOWN_BYTES = 200   # of a bad chunk or body, quoted in the error
# Finish reasons that end an answer before its end (vLLM's, when it aborts a request or fails in it).
UNFINISHED = frozenset({"abort", "error"})


class StreamFault(Exception):
    """The upstream broke the stream's format. The message continues "The upstream engine at URL ..."."""


def is_event_stream(content_type: str) -> bool:
    return content_type.lower().startswith("text/event-stream")


def not_a_stream(content_type: str, head: bytes) -> StreamFault:
    """Why an answer to a streamed request that is not an event stream cannot be read. ``head``:
    the start of its body, to quote (or the error object it carries)."""
    try:
        body = json.loads(head)
    except ValueError:
        body = None   # not JSON, or more of it than the head
    if isinstance(body, dict) and "error" in body:
        return StreamFault(f"failed: {error_of(head)[0]}")
    return StreamFault(f"answered a streamed request with {content_type or 'no Content-Type'} instead of an "
                       f"event stream (text/event-stream): {_show(head)}")


def read_pieces(lines: Iterable[bytes], stop: threading.Event, top: int | None) -> Iterator[Piece]:
    """The pieces of an event stream's lines, until its ``finish_reason`` or ``[DONE]``; nothing
    more once ``stop`` is set. ``top``: log-probability alternatives wanted, None for none."""
    for raw in lines:
        if stop.is_set():
            return
        if not raw.startswith(b"data:"):
            continue   # a comment (keep-alive), an event name, the blank line between events
        data = raw[5:].strip()
        if data == b"[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise StreamFault(f"sent a stream chunk that is not JSON: {_show(data)}") from None
        if not isinstance(chunk, dict):
            raise StreamFault(f"sent a stream chunk that is not an object: {_show(data)}")
        if "error" in chunk:
            message, _ = error_of(data)
            raise StreamFault(f"failed while generating: {message}")
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise StreamFault(f"sent a stream chunk whose choices are not a list: {_show(data)}")
        for choice in choices:
            finish = yield from _choice(choice, top, data)
            if finish:
                return
    raise StreamFault("ended its stream in the middle of the answer (no finish_reason, no data: [DONE]); "
                      "the answer is incomplete.")


def _choice(choice: Any, top: int | None, data: bytes) -> Generator[Piece, None, str | None]:
    """A choice's pieces; returns its finish reason, if it has one."""
    text = choice.get("text") if isinstance(choice, dict) else None
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(text, (str, type(None))) \
            or not isinstance(finish, (str, type(None))):
        raise StreamFault(f"sent a stream chunk that is not a completion chunk: {_show(data)}")
    if finish in UNFINISHED:
        raise StreamFault(f"gave up on the answer (finish_reason {finish!r}); the answer is incomplete.")
    text = text or ""
    try:
        entries = _logprobs(choice.get("logprobs"), top) if top is not None else []
    except (KeyError, TypeError, ValueError, AttributeError):
        raise StreamFault(f"sent log-probabilities of an unknown shape: {_show(data)}") from None
    if entries and "".join(e.token for e in entries) == text:
        for e in entries[:-1]:
            yield Piece(e.token, tokens=1, logprob=e)
        last = entries[-1]
        yield Piece(last.token, tokens=1, logprob=last, finish_reason=_finish(finish))
    elif text or finish:
        # The engine's chunks are not tokens: the reply's tokens are counted at its end.
        yield Piece(text, tokens=None, finish_reason=_finish(finish))
    return finish


def _show(data: bytes) -> str:
    text = data[:SHOWN_BYTES].decode(errors="replace").strip()
    return repr(text + ("..." if len(data) > SHOWN_BYTES else "")) if text else "an empty body"


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
    for tok, value, alt in zip(tokens, lps, tops, strict=False):
        alts = sorted((alt or {}).items(), key=lambda kv: -kv[1])
        out.append(TokenLogprob(tok, float(value if value is not None else 0.0), None,
                                [(t, float(v), None) for t, v in alts[:top]]))
    return out
