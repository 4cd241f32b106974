"""`RespReader`: pipelined Redis GETs whose values are received straight into the caller's buffers.

redis-py turns each value into a `bytes` object (its reader joins socket reads into one), which the
tier then copies into the destination: two passes over every byte beside the network's one. Here
each GET reply is parsed by hand from one socket per thread::

    send:    *2 $3 GET $N <name>   x k          (one sendall for the whole pipeline)
    receive: $<len>\r\n <64-byte chunk header> <payload: recv_into out[:stored]> \r\n    (or $-1\r\n)

The header is read first, so a value that does not fit its buffer is drained and reported, never
written past the end. Socket failures raise redis.ConnectionError, which the tier maps like any
other Redis failure. Plain TCP or unix-socket servers only (rediss:// and Cluster use redis-py).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from typing import Any

import redis
import torch

logger = logging.getLogger(__name__)

_DRAIN_BYTES = 1 << 20


class RespReader:
    """Per-thread raw connections to one Redis server, for GET into buffers. Thread-safe."""

    def __init__(self, connection_kwargs: dict[str, Any], timeout_s: float) -> None:
        self.kwargs, self.timeout_s = connection_kwargs, timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []

    @staticmethod
    def supports(client: object) -> bool:
        """True for a plain redis.Redis over TCP or a unix socket (not TLS, not Cluster)."""
        if not isinstance(client, redis.Redis):
            return False
        pool_class = client.connection_pool.connection_class
        return pool_class in (redis.Connection, redis.UnixDomainSocketConnection)

    def _sock(self) -> socket.socket:
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is None:
            sock = self._connect()
            self._local.sock, self._local.pending = sock, b""
            with self._lock:
                self._socks.append(sock)
        return sock

    def _connect(self) -> socket.socket:
        kw = self.kwargs
        try:
            if kw.get("path"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout_s)
                sock.connect(kw["path"])
            else:
                sock = socket.create_connection((kw.get("host", "127.0.0.1"), kw.get("port", 6379)), self.timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        except OSError as exc:
            raise redis.ConnectionError(f"cannot connect: {exc}") from exc
        setup: list[list[bytes]] = []
        if kw.get("password"):
            auth = [kw["username"], kw["password"]] if kw.get("username") else [kw["password"]]
            setup.append([b"AUTH", *(str(a).encode() for a in auth)])
        if kw.get("db"):
            setup.append([b"SELECT", str(kw["db"]).encode()])
        self._local.sock, self._local.pending = sock, b""
        for command in setup:
            sock.sendall(_pack(command))
            line = self._line()
            if not line.startswith(b"+"):
                sock.close()
                raise redis.ConnectionError(f"{command[0].decode()} refused: {line.decode(errors='replace')}")
        return sock

    def get_into(self, names: Sequence[str], heads: Sequence[memoryview], outs: Sequence[torch.Tensor]) -> list[int | None]:
        """Pipelined GET of `names`; value i's first len(heads[i]) bytes go to heads[i], the rest to
        outs[i] (a contiguous CPU uint8 tensor). Returns each value's payload length, None for a miss,
        minus the payload length for a value larger than its buffers (drained, not written)."""
        sock = self._sock()
        try:
            sock.sendall(b"".join(_pack([b"GET", name.encode()]) for name in names))
            return [self._value_into(head, out) for head, out in zip(heads, outs, strict=True)]
        except (OSError, ValueError) as exc:
            self.close_thread()
            raise redis.ConnectionError(f"GET pipeline failed: {exc!r}") from exc
        except redis.ResponseError:
            self.close_thread()
            raise

    def _value_into(self, head: memoryview, out: torch.Tensor) -> int | None:
        line = self._line()
        if line.startswith(b"-"):
            raise redis.ResponseError(line[1:].decode(errors="replace"))
        if not line.startswith(b"$"):
            raise ValueError(f"unexpected reply {line[:40]!r}")
        length = int(line[1:])
        if length < 0:
            return None
        payload = length - head.nbytes
        if payload < 0 or payload > out.numel():
            self._drain(length + 2)
            return -max(1, payload)
        self._recv_exact(head)
        self._recv_exact(out[:payload].numpy().data)
        self._drain(2)  # the value's trailing \r\n
        return payload

    def _line(self) -> bytes:
        pending: bytes = self._local.pending
        while b"\r\n" not in pending:
            data = self._local.sock.recv(65536)
            if not data:
                raise ConnectionResetError("Redis closed the connection")
            pending += data
        line, self._local.pending = pending.split(b"\r\n", 1)
        return line

    def _recv_exact(self, view: memoryview) -> None:
        view = view.cast("B")
        pending: bytes = self._local.pending
        take = min(len(pending), view.nbytes)
        view[:take] = pending[:take]
        self._local.pending = pending[take:]
        sock = self._local.sock
        while take < view.nbytes:
            got = sock.recv_into(view[take:])
            if not got:
                raise ConnectionResetError("Redis closed the connection mid-value")
            take += got

    def _drain(self, nbytes: int) -> None:
        scratch = bytearray(min(nbytes, _DRAIN_BYTES))
        while nbytes:
            step = min(nbytes, len(scratch))
            self._recv_exact(memoryview(scratch)[:step])
            nbytes -= step

    def close_thread(self) -> None:
        sock = getattr(self._local, "sock", None)
        self._local.sock, self._local.pending = None, b""
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            sock.close()


def _pack(parts: list[bytes]) -> bytes:
    return b"".join([f"*{len(parts)}\r\n".encode(), *(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)])
