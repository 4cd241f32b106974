"""A child program of tests/service/test_proc_probe.py: what a process reads of another through /proc.

    python -m tests.service.proc_probe PID MARKER

Prints one JSON object: "fds" (the memfd links it could list, or the error), "memfd_marker"
(whether any memfd it opened holds MARKER), "environ" (whether /proc/PID/environ could be read)
and "environ_marker" (whether it holds MARKER). Run without capabilities (setpriv) it is any
process of the same uid.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _memfds(pid: int, marker: bytes) -> dict[str, Any]:
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        links = {name: os.readlink(fd_dir / name) for name in os.listdir(fd_dir)}
    except OSError as exc:
        return {"fds": f"error: {exc.strerror}", "memfd_marker": False}
    memfds = [name for name, target in links.items() if target.startswith("/memfd:")]
    found = False
    for name in memfds:
        try:
            found = found or marker in (fd_dir / name).read_bytes()
        except OSError:
            continue
    return {"fds": memfds, "memfd_marker": found}


def _environ(pid: int, marker: bytes) -> dict[str, Any]:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as exc:
        return {"environ": f"error: {exc.strerror}", "environ_marker": False}
    return {"environ": "read", "environ_marker": marker in data}


def main() -> None:
    pid, marker = int(sys.argv[1]), sys.argv[2].encode()
    caps = next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("CapEff:"))
    print(json.dumps({"uid": os.getuid(), "cap_eff": caps, **_memfds(pid, marker), **_environ(pid, marker)}))


if __name__ == "__main__":
    main()
