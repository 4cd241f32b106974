"""A child program of tests/service/test_fd_socket.py: hostile peers of the daemon's descriptor socket.

    python -m tests.service.fd_socket_peers SOCKET idle|trickle N SECONDS

Keeps N connections open to SOCKET for SECONDS: "idle" ones send nothing, "trickle" ones send a
request one byte every 0.1 s and never finish it. A connection the daemon closes is opened again
at once, so N stay held the whole time. Prints "ready" once the first N are connected.
"""

from __future__ import annotations

import socket
import sys
import time

REQUEST = b'{"segment": "' + b"0" * 32 + b'", "token": "' + b"x" * 200 + b'"}'


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def _tick(sock: socket.socket, sent: int, trickle: bool) -> bool:
    """One step of a held connection; False once the daemon has closed it."""
    try:
        if trickle and sent < len(REQUEST):
            sock.send(REQUEST[sent:sent + 1])
        sock.setblocking(False)
        try:
            closed = sock.recv(64) == b""
        except BlockingIOError:
            closed = False
        sock.setblocking(True)
        return not closed
    except OSError:
        return False


def main() -> None:
    path, kind, count, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    held: list[tuple[socket.socket, int]] = []
    end = time.monotonic() + seconds
    announced = False
    while time.monotonic() < end:
        while len(held) < count:
            sock = _connect(path)
            if sock is None:
                break
            held.append((sock, 0))
        if not announced and len(held) >= count:
            print("ready", flush=True)
            announced = True
        alive = []
        for sock, sent in held:
            if _tick(sock, sent, kind == "trickle"):
                alive.append((sock, sent + 1))
            else:
                sock.close()
        held = alive
        time.sleep(0.1)


if __name__ == "__main__":
    main()
