"""`DirLock`: an exclusive flock on a tier directory, so two processes never own one local tier.

The lock file is `<dir>/.kvstore.lock`; it holds the owner's PID (for the refusal message) and
stays on disk after the owner exits (flock is released by the kernel when the process dies, so a
killed daemon never leaves a stale lock). `holder_pid` probes without taking the lock.
"""

from __future__ import annotations

import fcntl
import logging
import os

from kvstore.errors import ConfigError

logger = logging.getLogger(__name__)
LOCK_NAME = ".kvstore.lock"


def lock_path(directory: str | os.PathLike) -> str:
    return os.path.join(os.fspath(directory), LOCK_NAME)


class DirLock:
    """Hold an exclusive lock on `directory` (which must exist) until `release`."""

    def __init__(self, directory: str | os.PathLike, *, what: str) -> None:
        self.path = lock_path(directory)
        self._fd: int | None = _open_lock_file(self.path)
        if self._fd is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(self._fd)
            os.close(self._fd)
            self._fd = None
            raise ConfigError(locked_message(what, os.fspath(directory), pid, self.path)) from None
        _record_pid(self.path)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def holder_pid(directory: str | os.PathLike) -> int | None:
    """The PID of the process holding `directory`'s lock, or None when it is free (or absent)."""
    path = lock_path(directory)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_pid(fd) or -1
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def locked_message(what: str, directory: str, pid: int | None, path: str) -> str:
    owner = f"PID {pid}" if pid and pid > 0 else "another process"
    return (f"{what}: path = '{directory}' is in use by another kvstore process ({owner}, lock {path}); "
            "stop that process or give this one another path")


def _open_lock_file(path: str) -> int | None:
    """The lock file, created if needed and held open read-only (flock needs no write access, and a
    file held open for writing would keep its filesystem from being remounted read-only); None when
    it cannot exist there (a read-only folder without one: no process can write that tier)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError:
        pass
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        logger.warning("cannot create the lock file %s (read-only folder?); this tier runs unlocked", path)
        return None


def _record_pid(path: str) -> None:
    """Write the holder's PID into the lock file (after the lock is taken; closed again at once)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except OSError:
        return  # a read-only folder: the lock holds, the PID is not recorded
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
