"""Calls to the upstream engine that another thread can cut short.

``requests`` blocks its caller in a socket read: waiting for the answer's headers, then for each
chunk of a stream. A generation whose client has left, or whose upstream went silent past its
deadline, must not hold its slot until that read gives up by itself, so a watcher thread
(``Calls``) shuts the socket down under the blocked call, which then fails at once.

The socket is found through its connection: the session's pools (``session()``) hand out
connections that remember which call took them (``owner``). A pooled connection serves many
calls one after another, so a call may only ever shut down a connection it owns *now*: it stops
owning it when the connection goes back to the pool or the call ends, both under ``_LOCK``, the
same lock every shutdown is made under.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import ProxyManager

TICK = 0.05   # seconds between the watcher's looks at the calls in flight

_LOCK = threading.Lock()        # who owns which connection; every shutdown is made holding it
_current = threading.local()    # .call: the call this thread is sending, while it takes a connection


class Call:
    """One HTTP exchange in flight (a generation's request and its whole stream).

    ``deadline`` (monotonic seconds) is when the upstream must have said something more: first
    its headers (the first-byte timeout), then each chunk (the idle timeout); None while nothing
    is awaited from it (the caller is busy handing a chunk on to a client that reads slowly,
    which is no fault of the upstream). ``reason`` says why the call was cut short ("stopped":
    its client left; "timeout": the deadline passed), None while it was not.
    """

    def __init__(self, stop: threading.Event | None, first_byte: float):
        self.stop = stop
        self.deadline: float | None = time.monotonic() + first_byte
        self.answered = False    # its headers came
        self.reason: str | None = None
        self.conn: Any = None    # the connection it owns now (a connection of _Pool or _TLSPool), if any
        self.ended = False

    def expect(self, seconds: float | None) -> None:
        """The upstream has ``seconds`` from now to say more; None: nothing is awaited from it now."""
        self.deadline = None if seconds is None else time.monotonic() + seconds

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        """While the request is sent: the connection the pool hands out on this thread is this call's."""
        _current.call = self
        try:
            yield
        finally:
            _current.call = None

    def abort(self, reason: str) -> None:
        with _LOCK:
            if self.reason is not None or self.ended:
                return
            self.reason = reason
            if self.conn is not None and self.conn.owner is self:
                _shut(self.conn.sock)
            # (no socket yet: the connection is being opened, and _connected() shuts it once it is)

    def end(self) -> None:
        with _LOCK:
            self.ended = True
            if self.conn is not None and self.conn.owner is self:
                self.conn.owner = None
            self.conn = None


def _shut(sock: socket.socket | None) -> None:
    """Shuts a socket down for both directions, which wakes a read blocked on it in another thread.
    socket.socket's own method, so that an SSL socket is cut the same way (SSLSocket.shutdown
    would try a TLS close first)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):   # closed meanwhile by its own thread: nothing left to wake
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _claim(conn: Any) -> None:
    """A connection is handed out for a request: it belongs to the call sending it (or to none)."""
    call: Call | None = getattr(_current, "call", None)
    with _LOCK:
        conn.owner = call
        if call is not None:
            call.conn = conn
            if call.reason is not None:
                _shut(conn.sock)   # the call was cut short before it had a connection


def _release(conn: Any) -> None:
    """A connection goes back to the pool: from now on no call may shut it down."""
    if conn is None:
        return
    with _LOCK:
        owner = getattr(conn, "owner", None)
        if owner is not None and owner.conn is conn:
            owner.conn = None
        conn.owner = None


def _connected(conn: Any) -> None:
    with _LOCK:
        if conn.owner is not None and conn.owner.reason is not None:
            _shut(conn.sock)   # cut short while connecting


class _Connection(HTTPConnection):
    owner: Call | None = None

    def connect(self) -> None:
        super().connect()
        _connected(self)


class _TLSConnection(HTTPSConnection):
    owner: Call | None = None

    def connect(self) -> None:
        super().connect()
        _connected(self)


class _Owning:
    """A pool whose connections belong to the call they are handed out to, until they come back."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)   # type: ignore[misc]
        _claim(conn)
        return conn

    def _put_conn(self, conn: Any) -> None:
        _release(conn)
        super()._put_conn(conn)   # type: ignore[misc]


class _Pool(_Owning, HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(_Owning, HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


POOLS: dict[str, Any] = {"http": _Pool, "https": _TLSPool}


class _Adapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, ProxyManager):   # (a SOCKS proxy's pools are its own: not abortable)
            manager.pool_classes_by_scheme = POOLS
        return manager


def session(pool_size: int) -> requests.Session:
    """A session whose connections the calls of a ``Calls`` can cut, one pool per upstream host."""
    s = requests.Session()
    for scheme in ("http://", "https://"):
        s.mount(scheme, _Adapter(pool_connections=1, pool_maxsize=pool_size))
    return s


class Calls:
    """The calls in flight to one upstream, and the thread that cuts short those whose client has
    left (their stop event set) or whose deadline has passed. The thread looks every TICK while
    calls are in flight and sleeps while none are."""

    def __init__(self) -> None:
        self._live: set[Call] = set()
        self._changed = threading.Condition()
        self._watcher: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def track(self, stop: threading.Event | None, first_byte: float) -> Iterator[Call]:
        call = Call(stop, first_byte)
        with self._changed:
            self._live.add(call)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="upstream-calls", daemon=True)
                self._watcher.start()
            self._changed.notify()
        try:
            yield call
        finally:
            call.end()
            with self._changed:
                self._live.discard(call)

    def _watch(self) -> None:
        with self._changed:
            while not self._closed:
                now = time.monotonic()
                for call in self._live:
                    if call.stop is not None and call.stop.is_set():
                        call.abort("stopped")
                    elif call.deadline is not None and now >= call.deadline:
                        call.abort("timeout")
                self._changed.wait(TICK if self._live else None)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            for call in self._live:
                call.abort("stopped")
            self._changed.notify()
