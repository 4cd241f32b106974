"""Wait on a condition, not a clock: poll a predicate until it holds or a deadline passes; follow a child's output."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from service.process import ChildProcess

POLL_S = 0.02


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0, *, poll_s: float = POLL_S) -> bool:
    """True as soon as `predicate()` is; False if it is still false after `timeout_s` (assert on the result)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def follow(path: Path, proc: ChildProcess, timeout_s: float = 60.0) -> Iterator[str]:
    """Each line a child writes to the file `path`, as it comes (like reading its stdout pipe); ends once the child
    has exited and every complete line is read. Raises TimeoutError when nothing ends it within `timeout_s`."""
    end = time.monotonic() + timeout_s
    path.touch()
    with path.open() as lines:
        partial = ""
        while True:
            partial += lines.readline()
            if partial.endswith("\n"):
                yield partial
                partial = ""
            elif proc.poll() is not None:
                yield from (line for line in (partial + lines.read()).splitlines(keepends=True) if line.endswith("\n"))
                return
            elif time.monotonic() > end:
                raise TimeoutError(f"child {proc.pid} still running after {timeout_s} s; its output: {path}")
            else:
                time.sleep(POLL_S / 2)
