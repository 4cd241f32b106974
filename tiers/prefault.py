"""`touch_pages`: touch every page of a new arena in steps, with a progress line when it is large.

Touching a 64 GiB arena takes tens of seconds; a progress line on stderr (rich) tells an operator
the daemon is working, not hung, and how far it got if the machine refuses the memory.
"""

from __future__ import annotations

import logging
import sys

import torch

logger = logging.getLogger(__name__)

STEP_BYTES = 256 << 20
PROGRESS_FROM_BYTES = 1 << 30  # smaller arenas are touched in well under a second: no line


def touch_pages(arena: torch.Tensor, label: str) -> None:
    """Zero `arena` (1-D uint8) in STEP_BYTES pieces, showing progress for arenas of 1 GiB or more."""
    total = arena.numel()
    if total < PROGRESS_FROM_BYTES:
        arena.zero_()
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    logger.info("%s: touching %.1f GiB of memory", label, total / 2**30)
    columns = (TextColumn(f"{label}: touching memory"), BarColumn(), DownloadColumn(binary_units=True),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(file=sys.stderr), transient=False) as progress:
        task = progress.add_task("touch", total=total)
        for start in range(0, total, STEP_BYTES):
            end = min(total, start + STEP_BYTES)
            arena[start:end].zero_()
            progress.update(task, completed=end)
