"""Running batches: each instance takes one batch at a time from the store and sends its lines
through the server's own front door, in process, as requests of the batch's owner.

- **The same front door.** A line is an ASGI request to the app itself (``call``): the same guards,
  validation, queue, continuous batch and answers as a live client's, with none of a socket's cost.
  The request is marked as the server's own (core/auth.py ``INTERNAL``), so it carries the owner the
  batch was created by, never a key.
- **Live clients first.** A batch runs at most one line fewer than the generation line's places
  at once, and starts a line only while no request waits in that line: it fills what live clients
  leave free and never makes one wait for a slot behind more than what already runs.
- **Nothing lost.** Each line's result is stored as it comes; a restart (or another instance,
  once this one's heartbeat stops) takes the batch up again and runs only the lines not stored.
  In a shared store one instance claims a batch (rows.claim); the others leave it.
- **Cancel** is seen within half a second: the lines in flight are told their client left (which
  stops their generations) and the lines not run go to the error file as cancelled; so do the lines
  left when the 24-hour window ends (``expired``).
"""

from __future__ import annotations

import asyncio
import io as io_
import json
import logging
import time
from typing import Any

import anyio

from ..core.auth import CALLER_OWNER, INTERNAL, TRUSTED
from ..core.errors import OpenAIError, internal_error_body
from ..core.loops import Loop
from ..files.service import FilesService
from ..hosts.request import BACKGROUND
from ..responses.service import ResponsesService
from ..responses.store_health import StoreUnavailable
from ..text.service import TextService
from .lines import Invalid, Line, error, failed, output, parse, usage
from .rows import BatchRows

log = logging.getLogger(__name__)

POLL_S = 2.0     # how often a free instance looks for a batch another instance made
RETRY_S = (1.0, 2.0, 4.0, 8.0, 16.0, None)   # waits before a busy (429, 503) request is asked again
CHECK_S = 0.5    # how often a running batch looks for a cancel


async def call(app: Any, path: str, body: dict[str, Any], owner: str, gone: asyncio.Event, *,
               background: bool = True) -> tuple[int, Any]:
    """POSTs ``body`` to ``path`` of ``app`` as the server's own request for ``owner``; the
    status and the JSON answer. ``gone`` set: its client left (the work stops). ``background``:
    its generations are served after live clients' (a batch's line; not a live search's rewrite)."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
             "state": {CALLER_OWNER: owner}, INTERNAL: TRUSTED}
    if background:
        BACKGROUND.set(True)   # (this task's context: its generations are served after live clients')
    sent = False
    status, chunks = 500, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    data = b"".join(chunks)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode("utf-8", "replace")


def _first(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first ``kind`` in ``error`` or the exception groups it nests (anyio's task groups)."""
    if isinstance(error, kind):
        return error
    for inner in getattr(error, "exceptions", None) or ():
        found = _first(inner, kind)
        if found is not None:
            return found
    return None


class Runner:
    def __init__(self, rows: BatchRows, responses: ResponsesService, files: FilesService, text: TextService):
        self.rows, self.responses, self.files, self.text = rows, responses, files, text
        self.app: Any = None   # the ASGI app the lines are sent to
        self.loop = Loop("batches", "batches wait until the server restarts")

    def start(self, app: Any) -> None:
        self.app = app
        self.loop.start(self._forever)

    def wake(self) -> None:
        self.loop.wake()

    async def stop(self) -> None:
        await self.loop.stop()

    async def _forever(self) -> None:
        io, instance = self.responses.io, self.responses.store.instance_id
        while True:
            batch_id = await self._claim(io, instance)
            if batch_id is None:
                await self.loop.idle(POLL_S)
                continue
            try:
                await self.run(batch_id)
            except Exception as e:  # noqa: BLE001 - one batch's fault stops only that batch
                # (a task group raises its tasks' errors as a group: a store that went away is
                # found inside it, so the batch waits for the store instead of failing)
                lost = _first(e, StoreUnavailable)
                if lost is not None:
                    log.warning("batches: %s stopped while the store is unavailable (%s); it goes on when it is "
                                "back", batch_id, lost)
                    await anyio.sleep(POLL_S)
                    continue
                log.exception("batches: %s failed", batch_id)
                await self._fail(batch_id)

    async def _claim(self, io: Any, instance: str) -> str | None:
        try:
            if not self.responses.store.exists():   # nothing stored yet: no batch to find
                return None
            return await io(self.rows.claim, instance)
        except StoreUnavailable:
            return None
        except Exception:  # noqa: BLE001 - the loop must outlive any one failure
            log.exception("batches: could not look for work")
            return None

    async def _fail(self, batch_id: str) -> None:
        try:
            await self.responses.io(lambda: self.rows.update(
                batch_id, status="failed", failed_at=int(time.time()),
                errors={"object": "list", "data": [error("server_error", "The server failed while running the "
                                                                         "batch; see its log.")]}))
        except Exception:  # noqa: BLE001 - the store is down: the batch is taken up again later
            log.warning("batches: %s could not be marked failed", batch_id)

    async def run(self, batch_id: str) -> None:
        io = self.responses.io
        body = await io(self.rows.get, batch_id, None)
        assert body is not None   # (claimed: it is there)
        owner = await io(self.rows.owner, batch_id)
        problems: list[dict[str, Any]] = []
        try:
            _, content = await self.files.read(body["input_file_id"], owner)
            requests = await anyio.to_thread.run_sync(parse, content, body["endpoint"])
        except Invalid as invalid:
            problems = invalid.errors
        except StoreUnavailable:
            raise
        except OpenAIError as unreadable:
            problems = [error("invalid_file", f"The input file cannot be read: {unreadable.message}")]
        if problems:
            await io(lambda: self.rows.update(batch_id, status="failed", failed_at=int(time.time()),
                                              errors={"object": "list", "data": problems}))
            return
        if body["status"] == "validating":
            body = await io(lambda: self.rows.update(batch_id, status="in_progress", in_progress_at=int(time.time()),
                                                     request_counts={"total": len(requests), "completed": 0,
                                                                     "failed": 0}))
        end = "completed"
        if body["status"] == "in_progress":
            done = await io(self.rows.done, batch_id)
            end = await self._lines(batch_id, body, owner, [r for r in requests if r.number not in done])
        elif body["status"] == "cancelling":
            end = "cancelled"
        await self._finish(batch_id, owner, requests, end)

    async def _lines(self, batch_id: str, body: dict[str, Any], owner: str, todo: list[Line]) -> str:
        """Runs the lines; how the batch ends: completed, cancelled or expired."""
        io, text = self.responses.io, self.text
        stop, gone = asyncio.Event(), asyncio.Event()
        outcome = "completed"

        async def watch() -> None:
            nonlocal outcome
            while not stop.is_set():
                if time.time() >= body["expires_at"]:
                    outcome = "expired"
                elif await io(self.rows.cancel_requested, batch_id):
                    outcome = "cancelled"
                if outcome != "completed":
                    stop.set()
                    gone.set()
                    return
                with anyio.move_on_after(CHECK_S):
                    await stop.wait()

        async def one(line: Line) -> None:
            try:
                if line.body.get("stream"):
                    await io(self.rows.add_line, batch_id, line.number, False,
                             failed(line, "invalid_request", "stream is not supported in a batch; remove it."))
                    return
                for wait in RETRY_S:
                    try:
                        status, answer = await call(self.app, body["endpoint"], line.body, owner, gone)
                    except Exception as e:  # noqa: BLE001 - one request's fault is its own line, not the batch's
                        log.exception("batches: %s line %d failed", batch_id, line.number)
                        status, answer = 500, internal_error_body(e)
                    # busy for now (a full line, a model being loaded): asked again, later
                    if status not in (429, 503) or wait is None or gone.is_set():
                        break
                    with anyio.move_on_after(wait):
                        await stop.wait()
                if gone.is_set():
                    return   # cut short by a cancel or the window's end: reported as such at the end
                await io(self.rows.add_line, batch_id, line.number, 200 <= status < 300, output(line, status, answer))
            finally:
                places.release()

        # (counted once: the line's places change when the model does)
        lanes = max(1, text.queue.capacity - 1)
        places = asyncio.Semaphore(lanes)
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            for line in todo:
                await places.acquire()
                while text.queue.waiting > 0 and not stop.is_set():   # live clients first
                    with anyio.move_on_after(0.05):
                        await stop.wait()
                if stop.is_set():
                    places.release()
                    break
                group.start_soon(one, line)
            # every line started: wait for them, then stop the watcher
            for _ in range(lanes):
                await places.acquire()
            stop.set()
        return outcome

    async def _finish(self, batch_id: str, owner: str, requests: list[Line], end: str) -> None:
        io, now = self.responses.io, int(time.time())
        if end == "completed":
            await io(lambda: self.rows.update(batch_id, status="finalizing", finalizing_at=now))
        done = await io(self.rows.done, batch_id)
        why = {"cancelled": ("batch_cancelled", "The batch was cancelled before this request ran."),
               "expired": ("batch_expired", "The batch's 24-hour window ended before this request ran.")}
        for line in requests:
            if line.number not in done:
                code, message = why.get(end, ("server_error", "This request was not run."))
                await io(self.rows.add_line, batch_id, line.number, False, failed(line, code, message))
        results = await io(self.rows.results, batch_id)
        files, expiry = self.files, await io(self.rows.output_expiry, batch_id)
        changes: dict[str, Any] = {}
        for ok, key, suffix in ((True, "output_file_id", "output"), (False, "error_file_id", "error")):
            chosen = [r for good, r in results if good is ok]
            if chosen:
                data = await anyio.to_thread.run_sync(_jsonl, chosen)
                made = await files.keep(io_.BytesIO(data), f"{batch_id}_{suffix}.jsonl", "batch_output", expiry, owner)
                changes[key] = made["id"]
        changes["usage"] = usage([r["response"]["body"] for good, r in results if good])
        stamp = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}[end]
        # (the total too: a batch cancelled while it was validating never set it)
        changes["request_counts"] = {"total": len(requests), "completed": 0, "failed": 0}
        await io(lambda: self.rows.update(batch_id, status=end, **{stamp: int(time.time())}, **changes))
        log.info("batches: %s %s (%d requests)", batch_id, end, len(requests))


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
