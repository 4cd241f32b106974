"""`LeanHTTP`: keep-alive HTTP/1.1 for the client's small control calls (lookup, shm reserve/commit,
acquire/release), one connection per calling thread, over TCP or a unix socket.

Why this and not httpx (a maintained library, already a dependency): a lookup is a ~100-byte
request and a ~100-byte answer, and httpx's per-request machinery costs more than the daemon's
whole answer. Measured in one run, interleaved, same daemon, same 8-key msgpack lookup, both
keep-alive (`kvstore bench service --quick`: service.control.*; a 2-core machine at load ~20):
this client 198 us per call = 0.19 x httpx's 1024 us, and 44 us of client CPU = 0.067 x httpx's
659 us. Earlier, on a quiet machine: httpx P50 0.88 ms; http.client 0.51 ms (it also sends the
headers and the body as two packets, so the daemon wakes twice); one `sendall` 0.11 ms, 29 us of
client CPU. The engine makes this call on every request's time-to-first-token path, so it stays.
Requests go out as one buffer and answers are parsed here: status line, headers, then a
Content-Length or chunked body (or, with `Connection: close`, the rest of the stream).
Chunk bytes over HTTP come the same way: `request(..., into=...)` receives a 200 answer's body with
`recv_into` straight into the caller's destination buffers (no httpx, no intermediate bytes).

A connection the daemon closed while idle (uvicorn's keep-alive timeout) is reopened once and the
request resent: the daemon closes only idle connections, so the request was never processed.
Any other failure is a `DaemonUnreachable`, which the client treats like a dead daemon.

Deadlines: a request ends by its calling thread's deadline (`within(budget_s)`, else `timeout_s` from its
start): the connect, the send and every receive get what is left of it, so a daemon that answers slowly
or trickles cannot stretch it; past it the connection is closed (its answer, if any, would come late)
and the request raises `DaemonUnreachable` from a `TimeoutError`. This is where the engine side's one
timeout per kind of call is enforced (connector/deadlines.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvstore.errors import KVStoreError

MAX_HEAD_BYTES = 64 << 10
MAX_ANSWER_BYTES = 256 << 20  # control answers are small; anything near this is a broken peer


class DaemonUnreachable(KVStoreError):
    """The daemon could not be reached or dropped the connection mid-answer."""


class _Stale(Exception):
    """The peer closed the connection before sending a byte of the answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A status, the body (empty when it went into the caller's buffers) and its content type."""

    status: int
    content: bytes
    content_type: str


Targets = Callable[[dict[str, str], int], list[memoryview]]  # (headers, content length) -> destination buffers
Connect = Callable[[float], socket.socket]  # (timeout_s) -> a connected socket


class _Deadline(threading.local):
    at: float | None = None  # this thread's deadline (time.monotonic()), None: each request's own timeout_s


class _Connection:
    """One socket and its read buffer. Not thread-safe: each thread has its own."""

    def __init__(self, connect: Connect) -> None:
        self.sock: socket.socket | None = None
        self._connect = connect
        self._buffer = b""
        self.deadline = 0.0  # time.monotonic() by which the current exchange ends

    def _left_s(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        return left

    def _arm(self) -> socket.socket:
        """The socket, its timeout set to what is left of the deadline (before every blocking call)."""
        sock = self.sock
        assert sock is not None
        sock.settimeout(self._left_s())
        return sock

    def exchange(self, request: bytes) -> Answer:
        """Send one request and read its answer; `_Stale` when the peer had closed the connection."""
        self._send(request)
        return self._read_answer()

    def _send(self, request: bytes) -> None:
        if self.sock is None:
            self.sock = self._connect(self._left_s())
            self._buffer = b""
        try:
            self._arm().sendall(request)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as exc:
            raise _Stale(str(exc)) from exc

    def _recv(self) -> bytes:
        data = self._arm().recv(65536)
        if not data:
            raise ConnectionResetError("connection closed by the daemon")
        return data

    def exchange_into(self, request: bytes, targets: Targets) -> Answer:
        """Like `exchange`, but a 200 answer's body is received straight into the buffers that
        `targets(headers, content_length)` returns (recv_into: no intermediate copy); the Answer
        then has empty content. Any other answer is read as usual."""
        self._send(request)
        status, headers, close = self._read_head()
        length = headers.get("content-length")
        if status != 200 or length is None or "chunked" in headers.get("transfer-encoding", "").lower():
            return self._read_body(status, headers, close)
        views = targets(headers, int(length))
        if sum(v.nbytes for v in views) != int(length):
            self.close()
            raise DaemonUnreachable(f"answer body is {length} bytes; the caller expected "
                                    f"{sum(v.nbytes for v in views)}")
        self._receive_into(views)
        if close:
            self.close()
        return Answer(status, b"", headers.get("content-type", ""))

    def _receive_into(self, views: list[memoryview]) -> None:
        buffer, self._buffer = self._buffer, b""
        for view in views:
            view = view.cast("B")
            take = min(len(buffer), view.nbytes)
            view[:take] = buffer[:take]
            buffer, filled = buffer[take:], take
            while filled < view.nbytes:
                got = self._arm().recv_into(view[filled:])
                if not got:
                    raise ConnectionResetError("connection closed mid-answer")
                filled += got
        self._buffer = buffer

    def _read_answer(self) -> Answer:
        return self._read_body(*self._read_head())

    def _read_head(self) -> tuple[int, dict[str, str], bool]:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buffer) > MAX_HEAD_BYTES:
                raise DaemonUnreachable(f"answer headers over {MAX_HEAD_BYTES} bytes")
            try:
                data = self._arm().recv(65536)
            except (ConnectionResetError, ConnectionAbortedError) as exc:
                if not buffer:
                    raise _Stale(str(exc)) from exc
                raise
            if not data:
                if not buffer:
                    raise _Stale("closed before answering")
                raise ConnectionResetError("connection closed mid-answer")
            buffer += data
        head, self._buffer = buffer[:end].decode("latin-1"), buffer[end + 4:]
        status_line, *lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise DaemonUnreachable(f"not an HTTP answer: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        close = headers.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0"
        return int(parts[1]), headers, close

    def _read_body(self, status: int, headers: dict[str, str], close: bool) -> Answer:
        buffer = self._buffer
        if "chunked" in headers.get("transfer-encoding", "").lower():
            content, buffer = self._read_chunked(buffer)
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if length > MAX_ANSWER_BYTES:
                raise DaemonUnreachable(f"answer of {length} bytes is over {MAX_ANSWER_BYTES}")
            while len(buffer) < length:
                buffer += self._recv()
            content, buffer = buffer[:length], buffer[length:]
        elif close:
            pieces = [buffer]
            while data := self._arm().recv(65536):
                pieces.append(data)
            content, buffer = b"".join(pieces), b""
        else:
            content = b""
        self._buffer = buffer
        if close:
            self.close()
        return Answer(status, content, headers.get("content-type", ""))

    def _read_chunked(self, buffer: bytes) -> tuple[bytes, bytes]:
        pieces: list[bytes] = []
        total = 0
        while True:
            while b"\r\n" not in buffer:
                buffer += self._recv()
            size_line, buffer = buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            total += size
            if total > MAX_ANSWER_BYTES:
                raise DaemonUnreachable(f"chunked answer over {MAX_ANSWER_BYTES} bytes")
            if size == 0:
                while b"\r\n\r\n" not in buffer and not buffer.startswith(b"\r\n"):
                    buffer += self._recv()  # trailers, then the blank line
                buffer = buffer[2:] if buffer.startswith(b"\r\n") else buffer.split(b"\r\n\r\n", 1)[1]
                return b"".join(pieces), buffer
            while len(buffer) < size + 2:
                buffer += self._recv()
            pieces.append(buffer[:size])
            buffer = buffer[size + 2:]

    def close(self) -> None:
        sock, self.sock = self.sock, None
        self._buffer = b""
        if sock is not None:
            sock.close()


class LeanHTTP:
    """Per-thread keep-alive connections to one daemon ("http://host:port" or "unix:///path")."""

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float) -> None:
        parsed = urllib.parse.urlparse(url)
        self._connect: Connect
        if parsed.scheme == "unix":
            path, host = parsed.path, "kvstore"
            self._connect = lambda left_s: _unix_socket(path, left_s)
        elif parsed.scheme == "http" and parsed.hostname:
            address, host = (parsed.hostname, parsed.port or 80), parsed.netloc
            self._connect = lambda left_s: _tcp_socket(address, left_s)
        else:
            raise KVStoreError(f"daemon url {url!r}: use http://HOST:PORT or unix:///path/to.sock")
        self._url = url
        self.timeout_s = timeout_s  # a request's budget when its thread set no deadline
        self._deadline = _Deadline()
        self._headers = dict(headers)
        self._head = f" HTTP/1.1\r\nHost: {host}\r\n"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: weakref.WeakSet[_Connection] = weakref.WeakSet()  # a dead thread's goes with it
        self._closed = False

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                into: Targets | None = None, headers: dict[str, str] | None = None) -> Answer:
        """One request; with `into`, a 200 answer's body lands in the buffers it returns (see exchange_into)."""
        body = body or b""
        extra = "".join(f"{name}: {value}\r\n" for name, value in {**self._headers, **(headers or {})}.items())
        typed = f"Content-Type: {content_type}\r\n" if content_type else ""
        request = f"{method} {path}{self._head}{typed}{extra}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body
        conn = self._connection()
        conn.deadline = self.deadline()
        for attempt in (0, 1):
            reused = conn.sock is not None
            try:
                return conn.exchange(request) if into is None else conn.exchange_into(request, into)
            except _Stale as exc:
                conn.close()
                if attempt == 1 or not reused:
                    raise DaemonUnreachable(f"kvstore daemon at {self._url} dropped the connection: {exc}") from exc
            except (OSError, ValueError, DaemonUnreachable) as exc:
                conn.close()
                if isinstance(exc, DaemonUnreachable):
                    raise
                raise DaemonUnreachable(f"kvstore daemon at {self._url}: {exc!r}") from exc
            except BaseException:
                conn.close()  # a caller's `into` refused the answer: its body is still unread
                raise
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def within(self, budget_s: float) -> Iterator[None]:
        """Every request this thread makes inside the block ends within `budget_s` of entering it (an
        enclosing block's earlier deadline stays)."""
        outer = self._deadline.at
        at = time.monotonic() + budget_s
        self._deadline.at = at if outer is None else min(outer, at)
        try:
            yield
        finally:
            self._deadline.at = outer

    def deadline(self) -> float:
        """When this thread's current request must end (time.monotonic())."""
        at = self._deadline.at
        return time.monotonic() + self.timeout_s if at is None else at

    def left_s(self) -> float:
        """What is left of this thread's deadline (never below a millisecond: the caller times out at once)."""
        return max(1e-3, self.deadline() - time.monotonic())

    def _connection(self) -> _Connection:
        if self._closed:
            raise DaemonUnreachable("client is closed")
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = _Connection(self._connect)
            with self._lock:
                self._open.add(conn)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._open)
        for conn in conns:
            conn.close()


def _tcp_socket(address: tuple[str, int], timeout_s: float) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _unix_socket(path: str, timeout_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock
