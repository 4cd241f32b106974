"""Keep the daemon's C heap from growing under churn: few malloc arenas, freed pages handed back.

glibc gives threads that allocate at once arenas of their own (up to 8 per core) and hands freed memory
back to the kernel only from the top of an arena. A daemon whose I/O threads allocate and free chunk-sized
buffers for hours keeps the freed middles resident, so its RSS creeps while the Python heap stays flat.
`limit_arenas` (M_ARENA_MAX) bounds the arenas at start; `HeapTrimmer` calls malloc_trim(0) every
TRIM_INTERVAL_S on one daemon thread, which returns free pages inside every arena. Elsewhere than glibc
both do nothing and say so in one log line.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

logger = logging.getLogger(__name__)
M_ARENA_MAX = -8  # glibc's mallopt parameter
ARENAS = 2
TRIM_INTERVAL_S = 30.0


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 - glibc has both; musl and others do not
        libc.malloc_trim  # noqa: B018
        return libc
    except (OSError, AttributeError):
        return None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """At most `arenas` malloc arenas from now on; False where the C library is not glibc."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def trim() -> bool:
    """Hand free heap pages back to the kernel; True when glibc released some."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0) == 1)


class HeapTrimmer:
    """A daemon thread that trims the C heap every `interval_s` until `close()`."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvstore-heap-trim", daemon=True)

    def start(self) -> HeapTrimmer:
        if _libc() is None:
            logger.info("C library is not glibc: the daemon's heap is not trimmed")
            return self
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            trim()
            self.trims += 1

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
