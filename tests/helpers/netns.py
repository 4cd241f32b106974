"""A command in a network namespace of its own, with only its loopback: README blocks that bind fixed ports (a daemon
on 8765, vLLM or the proxy on 8000) then run at the same time without meeting each other's servers.

`wrap(cmd)` runs `unshare --user --map-root-user --net` and, inside, this file, which brings `lo` up (a new namespace
starts with it down) and execs the command. Unix sockets, files and shared memory are the host's as before; only
the network is private. `available()` says whether this machine allows it (a container may forbid namespaces);
where it does not, the blocks on fixed ports run one after another (tests/integration/scheduling.py).
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH14x"  # struct ifreq: the interface name, then ifr_flags


def loopback_up() -> None:
    """Bring this namespace's `lo` up (what `ip link set lo up` does, without needing iproute2)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _, flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def wrap(cmd: list[str]) -> list[str]:
    """`cmd` to run in a network namespace of its own."""
    return ["unshare", "--user", "--map-root-user", "--net", sys.executable, str(Path(__file__)), *cmd]


_PROBE = ("import socket\n"
          "server = socket.create_server(('127.0.0.1', 8765))\n"
          "socket.create_connection(('127.0.0.1', 8765), timeout=5).close()\n")


@functools.cache
def available() -> bool:
    """Whether a namespace can be made here and a server in it answers on its loopback."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(wrap([sys.executable, "-c", _PROBE]), capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


if __name__ == "__main__":
    loopback_up()
    os.execvp(sys.argv[1], sys.argv[1:])
