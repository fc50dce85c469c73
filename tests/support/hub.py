"""A local stand-in for the model hub: the routes huggingface_hub uses to resolve and fetch a
model repo, answered from files on disk, so the library runs for real with no network.

- ``GET /api/models/{org}/{name}[/revision/{rev}]``: the repo's info with its files and sizes
  (``?blobs=true`` as the hub sends them);
- ``HEAD|GET /{org}/{name}/resolve/{rev}/{path}``: a file, with the hub's headers (the commit,
  the ETag of its content, its size) and byte ranges, so an interrupted download resumes;
- a repo marked gated answers 401 with the hub's gated error code to a request without the token.

``cut_once`` makes the next GET of that file stop after so many bytes (the connection closed
mid-body), as a network that drops does; ``requests`` records every request's method, path and
Range header."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, Path]           # path in the repo -> file on disk
    gated_token: str | None = None   # the token a gated repo wants


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    cut_once: dict[str, int] = field(default_factory=dict)   # "org/name/path" -> bytes sent before the cut
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> "Hub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, head=True)

            def do_GET(self) -> None:
                hub._answer(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def fetched(self, name: str) -> list[str | None]:
        """The Range headers of the GETs of a file (None: from the start)."""
        return [rng for method, path, rng in self.requests if method == "GET" and path.endswith("/" + name)]

    # --- answers ------------------------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append((h.command, path, h.headers.get("Range")))
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        repo_id = (info or resolve).group(1) if (info or resolve) else None   # type: ignore[union-attr]
        repo = self.repos.get(repo_id or "")
        if repo is None:
            return self._send(h, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head)
        if repo.gated_token and h.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            return self._send(h, 401, {"error": f"Access to model {repo_id} is restricted."},
                              {"X-Error-Code": "GatedRepo"}, head)
        if info:
            siblings = [{"rfilename": name, "size": p.stat().st_size} for name, p in sorted(repo.files.items())]
            return self._send(h, 200, {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "private": False,
                                       "siblings": siblings}, {}, head)
        assert resolve is not None
        name = resolve.group(2)
        if name not in repo.files:
            return self._send(h, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}, head)
        self._file(h, f"{repo_id}/{name}", repo.files[name], head)

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: dict, headers: dict[str, str], head: bool) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(data)

    def _file(self, h: BaseHTTPRequestHandler, key: str, path: Path, head: bool) -> None:
        data = path.read_bytes()
        etag = hashlib.sha256(data).hexdigest()
        start = 0
        rng = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range") or "")
        if rng and not head:
            start = int(rng.group(1))
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{etag}"')
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        cut = self.cut_once.pop(key, None)
        if cut is not None:
            h.wfile.write(data[start:start + cut])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)   # the network drops mid-body
            return
        h.wfile.write(data[start:])
