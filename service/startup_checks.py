"""Daemon start-up: validate the config and bind the listener before the store allocates anything.

`kvstore serve` runs, in order: the store checks (kvstore/preflight.py: memory, paths; then
kvstore/store/config_checks.py: directory locks, names, options), `bind_listener` (the TCP port or
unix socket, bound here so a port in use or a socket in a missing folder fails in one line, before
"ready" and before the arena is touched), then opens the store and hands the bound socket to uvicorn.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

from kvstore.errors import ConfigError


def bind_listener(host: str, port: int, uds: str | None) -> socket.socket:
    """A listening socket on host:port or at the unix socket path `uds`; ConfigError naming the fix."""
    if uds is not None:
        return _bind_unix(Path(uds))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"--port {port}: {host}:{port} is already in use (another kvstore serve?); "
                              "stop that process or choose another --port") from None
        raise ConfigError(f"--host {host} --port {port}: cannot bind ({exc.strerror}); "
                          "choose an address of this machine and a free port") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _bind_unix(path: Path) -> socket.socket:
    if not path.parent.is_dir():
        raise ConfigError(f"--uds {path}: the folder '{path.parent}' does not exist; "
                          f"create it (mkdir -p {path.parent}) or choose a socket path in an existing folder")
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ConfigError(f"--uds {path}: a file that is not a socket is in the way; "
                              "remove it or choose another path")
        if _socket_alive(path):
            raise ConfigError(f"--uds {path}: another process is listening on this socket; "
                              "stop it or choose another path")
        path.unlink()  # a stale socket left by a killed daemon
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--uds {path}: cannot bind ({exc.strerror}); choose a writable folder") from None
    os.chmod(path, 0o660)  # owner and group only: the socket is the daemon's front door
    sock.listen(2048)
    return sock


def _socket_alive(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def close_listener(sock: socket.socket, uds: str | None) -> None:
    sock.close()
    if uds is not None:
        Path(uds).unlink(missing_ok=True)
