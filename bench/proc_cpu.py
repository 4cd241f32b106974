"""CPU seconds a set of processes has used (user + system, all threads), read from /proc: where a benchmark's
CPU went on a machine its processes share."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int]) -> float:
    """utime + stime of each live process in `pids` (those gone meanwhile count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])  # stat fields 14 and 15 (after pid and comm)
    return total / _TICKS
