"""A fake upstream engine that misbehaves on demand: a real HTTP server on a free port, in threads.

It answers as vLLM's server does (the routes tests/doubles/vllm answers: ``/v1/models`` with
``max_model_len``, ``/tokenize`` with a prompt or messages, ``/detokenize``), so the front takes it
for vLLM. Its "tokens" are the UTF-8 bytes of the text. ``/v1/completions`` answers as ``mode``
says:

- ``ok``: a stream of "Hello", " there", a finish_reason and ``data: [DONE]``
- ``hang``: accepts the request and never answers it (not even the headers)
- ``hang_mid``: the headers and "Hello", then silence
- ``garbage``: a chunk that is not JSON; ``shape``: a JSON chunk that is not a completion chunk
- ``cut``: "Hello" and " there", then the connection closed cleanly (no finish_reason, no [DONE])
- ``unchunked``: a whole stream in a body that is not chunked (it ends where the connection closes),
  "Hello" first, the rest only once ``release`` is set
- ``abort``: "Hello", then finish_reason "abort" (vLLM's, for a request it gave up on)
- ``html``: a 200 HTML page; ``json``: a 200 completion as one JSON body (no stream)
- ``error_event``: a 200 stream whose chunk is an error object
- ``400``: a 400 with an error object (the client's mistake); ``500``: a 500 with one

A hanging answer waits until the client closes the connection (counted in ``closed``) or the
fake is stopped. ``stop()`` is the engine's process dying, ``start()`` it coming back. ``models_ok`` off makes ``/v1/models`` answer 503 (the engine is down for the
front's health checks). ``hits`` counts the requests per path.
"""

from __future__ import annotations

import collections
import contextlib
import json
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake/model"
WORDS = ("Hello", " there")


def chatml(messages: list[dict[str, Any]]) -> str:
    out = [f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages]
    return "".join(out) + "<|im_start|>assistant\n"


def chunk(text: str, finish: str | None = None) -> bytes:
    body = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class FakeUpstream:
    def __init__(self) -> None:
        self.mode = "ok"
        self.models_ok = True
        self.hits: collections.Counter[str] = collections.Counter()
        self.connections = 0     # TCP connections accepted
        self.hanging = 0         # requests held by a hang now
        self.closed = 0          # hanging requests whose client closed the connection
        self.release = threading.Event()   # lets an unchunked stream go on past its first chunk
        self.rest_sent = False             # it has
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()   # connections open now, cut when the fake stops
        self.port = 0
        self.start()
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        """Listens (again, after stop(): on the same port, as an engine that was restarted)."""
        fake = self

        class Handler(_Handler):
            upstream = fake

        self._stopped = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-upstream", daemon=True)
        self._thread.start()

    def hit(self, path: str) -> None:
        with self._lock:
            self.hits[path] += 1

    def count(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + by)

    def hang(self, sock: socket.socket) -> None:
        """Holds a request until its client closes the connection, or the fake stops."""
        self.count("hanging")
        stopped = self._stopped
        try:
            while not stopped.is_set():
                readable, _, _ = select.select([sock], [], [], 0.05)
                if not readable:
                    continue
                try:
                    gone = sock.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    gone = True
                if gone and not stopped.is_set():
                    self.count("closed")
                    return
        finally:
            self.count("hanging", -1)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def opened(self, sock: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self._open.add(sock)

    def closing(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)

    def stop(self) -> None:
        """Stops listening and cuts every open connection, as a process that dies would."""
        self._stopped.set()
        self.server.shutdown()
        self.server.server_close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive: the front pools its connections
    upstream: FakeUpstream

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.upstream.opened(self.connection)

    def finish(self) -> None:
        self.upstream.closing(self.connection)
        super().finish()

    # answers -------------------------------------------------------------------------------------
    def send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, message: str) -> None:
        self.send(status, {"error": {"message": message, "type": "server_error", "param": None, "code": None}})

    def start_stream(self, chunked: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")   # the body ends where the connection does
            self.close_connection = True
        self.end_headers()

    def part(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def stream(self, *events: bytes) -> None:
        self.start_stream()
        for event in events:
            self.part(event)
        self.wfile.write(b"0\r\n\r\n")

    # routes --------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self.upstream.hit(self.path)
        if self.path == "/v1/models":
            if not self.upstream.models_ok:
                return self.error(503, "the engine is down")
            return self.send(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "owned_by": "fake", "max_model_len": 2048}]})
        self.send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        self.upstream.hit(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/tokenize":
            text = chatml(body["messages"]) if "messages" in body else body["prompt"]
            tokens = list(text.encode())
            return self.send(200, {"tokens": tokens, "count": len(tokens), "max_model_len": 2048})
        if self.path == "/detokenize":
            return self.send(200, {"prompt": bytes(body["tokens"]).decode(errors="replace")})
        if self.path == "/v1/completions":
            return self.completion(self.upstream.mode)
        self.send(404, {"detail": "Not Found"})

    def completion(self, mode: str) -> None:
        if mode == "ok":
            return self.stream(chunk(WORDS[0]), chunk(WORDS[1]), chunk("", "stop"), b"data: [DONE]\n\n")
        if mode == "hang":
            self.close_connection = True
            return self.upstream.hang(self.connection)
        if mode == "hang_mid":
            self.close_connection = True
            self.start_stream()
            self.part(chunk(WORDS[0]))
            return self.upstream.hang(self.connection)
        if mode == "garbage":
            return self.stream(chunk(WORDS[0]), b"data: {\"choices\": [{\"text\": \"oops\n\n", b"data: [DONE]\n\n")
        if mode == "shape":
            return self.stream(b'data: {"choices": "not a list"}\n\n', b"data: [DONE]\n\n")
        if mode == "cut":
            self.start_stream(chunked=False)
            self.wfile.write(chunk(WORDS[0]) + chunk(WORDS[1]))
            return None
        if mode == "unchunked":
            self.start_stream(chunked=False)
            self.wfile.write(chunk(WORDS[0]))
            self.wfile.flush()
            self.upstream.release.wait(60)
            self.upstream.rest_sent = True
            self.wfile.write(chunk(WORDS[1]) + chunk("", "stop") + b"data: [DONE]\n\n")
            return None
        if mode == "abort":
            return self.stream(chunk(WORDS[0]), chunk("", "abort"), b"data: [DONE]\n\n")
        if mode == "html":
            return self.send(200, b"<html><body><h1>Welcome to nginx!</h1></body></html>", "text/html")
        if mode == "json":
            return self.send(200, {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": MODEL,
                                   "choices": [{"index": 0, "text": "Hello there", "finish_reason": "stop"}]})
        if mode == "error_event":
            return self.stream(b'data: {"error": {"message": "CUDA out of memory", "type": "server_error"}}\n\n')
        if mode == "400":
            return self.send(400, {"error": {"message": "the prompt is too long", "type": "invalid_request_error",
                                             "param": "prompt", "code": None}})
        if mode == "500":
            return self.error(500, "the engine crashed")
        raise AssertionError(f"unknown mode {mode}")
