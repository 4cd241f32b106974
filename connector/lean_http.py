"""`LeanHTTP`: keep-alive HTTP/1.1 for the client's small control calls (lookup, shm reserve/commit,
acquire/release), one stdlib connection per calling thread, over TCP or a unix socket.

Why not httpx for these: a lookup is a ~100-byte request and a ~100-byte answer, and httpx's
per-request machinery costs about as much as the daemon's whole answer (measured on loopback:
lookup P50 0.88 ms through httpx, 0.51 ms through http.client). Chunk bytes over HTTP still go
through httpx's streaming in the client.

A connection the daemon closed while idle (uvicorn's keep-alive timeout) is reopened once and the
request resent: the daemon closes only idle connections, so the request was never processed.
Any other failure is a `DaemonUnreachable`, which the client treats like a dead daemon.
"""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.parse
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from kvstore.errors import KVStoreError

_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class DaemonUnreachable(KVStoreError):
    """The daemon could not be reached or dropped the connection mid-answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    content: bytes
    content_type: str


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("kvstore", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class LeanHTTP:
    """Per-thread keep-alive connections to one daemon ("http://host:port" or "unix:///path")."""

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float) -> None:
        parsed = urllib.parse.urlparse(url)
        self._new: Callable[[], http.client.HTTPConnection]
        if parsed.scheme == "unix":
            path = parsed.path
            self._new = lambda: _UnixConnection(path, timeout_s)
        elif parsed.scheme == "http" and parsed.hostname:
            host, port = parsed.hostname, parsed.port or 80
            self._new = lambda: http.client.HTTPConnection(host, port, timeout=timeout_s)
        else:
            raise KVStoreError(f"daemon url {url!r}: use http://HOST:PORT or unix:///path/to.sock")
        self._url = url
        self._headers = dict(headers)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()  # a dead thread's goes with it
        self._closed = False

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None) -> Answer:
        headers = self._headers if content_type is None else {**self._headers, "Content-Type": content_type}
        conn, reused = self._connection()
        try:
            return self._send(conn, method, path, body, headers)
        except _STALE as exc:
            self._drop(conn)
            if not reused:
                raise DaemonUnreachable(f"kvstore daemon at {self._url} dropped the connection: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            self._drop(conn)
            raise DaemonUnreachable(f"kvstore daemon at {self._url}: {exc!r}") from exc
        conn, _ = self._connection()  # the idle keep-alive connection had been closed: once more, fresh
        try:
            return self._send(conn, method, path, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            self._drop(conn)
            raise DaemonUnreachable(f"kvstore daemon at {self._url}: {exc!r}") from exc

    @staticmethod
    def _send(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None,
              headers: dict[str, str]) -> Answer:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        content = response.read()
        if response.will_close:
            conn.close()
        return Answer(response.status, content, response.getheader("Content-Type", ""))

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None:
            return conn, True
        if self._closed:
            raise DaemonUnreachable("client is closed")
        if conn is None:
            conn = self._new()
            with self._lock:
                self._open.add(conn)
            self._local.conn = conn
        return conn, False  # connects on first use

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._open)
        for conn in conns:
            conn.close()
