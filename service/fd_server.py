"""`FdServer`: the unix socket (0600) that hands a segment's descriptor to the client that owns it.

    client: connect; send {"segment": id, "token": <bearer token>}   (JSON, at most 4 KiB)
            <- "ok\\n" with the memfd (SCM_RIGHTS), or a one-line refusal; the connection closes

One thread serves every connection through a selector, as nginx's accept loop does: no peer that
connects and then sends nothing, or one byte at a time, holds up anyone else. Each connection
has `deadline_s` to send its request (then it is closed); connections are capped per peer process
(SO_PEERCRED pid) and overall, and one past a cap is closed at once, so the cost of a hostile
neighbour is bounded by the caps and never reaches another peer's hand-over.

`remove_stale_sockets` deletes the `kvstore-<pid>-*.fds` sockets that a daemon killed with
SIGKILL left in the temp directory (nobody listens on them any more).
"""

from __future__ import annotations

import json
import logging
import os
import re
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.errors import NotFoundError
from service.shm_plane import SegmentRegistry
from service.tenants import Tenant

logger = logging.getLogger(__name__)
HELLO_LIMIT = 4096
STALE_NAME = re.compile(r"kvstore-\d+-[0-9a-f]+\.fds")


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    peer_pid: int
    deadline: float
    hello: bytearray = field(default_factory=bytearray)


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of a unix socket (0 when it is in another pid namespace)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


class FdServer:
    """Serves descriptor hand-overs on `path` until `close()`.

    Args:
        path: the socket's path (created mode 0600; an old file there is replaced).
        registry: the segments whose descriptors it hands over.
        tenant_of: the tenant a token names (None: none).
        deadline_s: a connection's time to send its request.
        max_per_peer, max_connections: open connections per peer process and in all.
    """

    def __init__(self, path: Path, registry: SegmentRegistry, tenant_of: Callable[[str], Tenant | None], *,
                 deadline_s: float = 1.0, max_per_peer: int = 8, max_connections: int = 64) -> None:
        self.path, self.registry, self.tenant_of = path, registry, tenant_of
        self.deadline_s, self.max_per_peer, self.max_connections = deadline_s, max_per_peer, max_connections
        self.num_refused = self.num_expired = 0
        self._sock = _listen(path)
        self._conns: dict[socket.socket, _Connection] = {}
        self._per_peer: Counter[int] = Counter()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name="kv-shm-fds", daemon=True)
        self._thread.start()

    def stats(self) -> dict[str, int]:
        """Open connections now, and those refused at a cap or closed at their deadline so far."""
        return {"fd_socket_open": len(self._conns), "fd_socket_refused": self.num_refused,
                "fd_socket_expired": self.num_expired}

    def _serve(self) -> None:
        while True:
            for key, _ in self._selector.select(self._next_timeout()):
                if key.fileobj == self._wake_r:
                    return
                try:
                    if key.fileobj is self._sock:
                        self._accept()
                    elif key.fileobj in self._conns:
                        self._receive(self._conns[key.fileobj])  # type: ignore[index]
                except Exception:  # one bad connection must not end the loop that serves all
                    logger.exception("descriptor socket: a connection failed")
            self._expire(time.monotonic())

    def _next_timeout(self) -> float | None:
        if not self._conns:
            return None
        return max(0.0, min(c.deadline for c in self._conns.values()) - time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: the next round tries again
                logger.warning("descriptor socket: accept failed: %s", exc)
                return
            try:
                pid = peer_pid(sock)
            except OSError:
                sock.close()
                continue
            if len(self._conns) >= self.max_connections or self._per_peer[pid] >= self.max_per_peer:
                self.num_refused += 1
                logger.info("descriptor socket: refused a connection of pid %d (%d open from it, %d in all; caps %d "
                            "and %d)", pid, self._per_peer[pid], len(self._conns), self.max_per_peer, self.max_connections)
                sock.close()
                continue
            sock.setblocking(False)
            self._conns[sock] = _Connection(sock, pid, time.monotonic() + self.deadline_s)
            self._per_peer[pid] += 1
            self._selector.register(sock, selectors.EVENT_READ)

    def _receive(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(HELLO_LIMIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        conn.hello += data
        if not data or len(conn.hello) > HELLO_LIMIT:
            self._drop(conn)
            return
        try:
            request = json.loads(conn.hello)
        except ValueError:
            return  # not complete yet: more bytes, or the deadline
        try:
            self._answer(conn, request)
        except (OSError, ValueError) as exc:
            logger.info("shared-memory descriptor request refused: %s", exc)
        self._drop(conn)

    def _answer(self, conn: _Connection, request: object) -> None:
        if not isinstance(request, dict):
            raise ValueError("the request must be a JSON object")
        tenant = self.tenant_of(str(request.get("token", "")))
        try:
            fd = self.registry.hand_over(request.get("segment"), tenant.name if tenant else "", conn.peer_pid)
        except NotFoundError:
            conn.sock.send(b"no such segment for this token\n")
            return
        socket.send_fds(conn.sock, [b"ok\n"], [fd])

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self.num_expired += 1
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        self._selector.unregister(conn.sock)
        del self._conns[conn.sock]
        self._per_peer[conn.peer_pid] -= 1
        if self._per_peer[conn.peer_pid] <= 0:
            del self._per_peer[conn.peer_pid]
        conn.sock.close()

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._sock.close()
        self.path.unlink(missing_ok=True)


def _listen(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def remove_stale_sockets(directory: Path) -> list[Path]:
    """Delete the descriptor sockets of dead daemons in `directory` (their name is ours, this uid owns
    them, and connecting is refused: nobody listens). Returns the paths removed."""
    removed = []
    for path in directory.glob("kvstore-*-*.fds"):
        if not STALE_NAME.fullmatch(path.name) or not _is_stale(path):
            continue
        try:
            path.unlink()
        except OSError as exc:
            logger.info("cannot remove stale descriptor socket %s: %s", path, exc)
            continue
        removed.append(path)
    if removed:
        logger.info("removed %d descriptor sockets left by daemons that were killed", len(removed))
    return removed


def _is_stale(path: Path) -> bool:
    try:
        if path.lstat().st_uid != os.getuid():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            probe.connect(str(path))
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False
