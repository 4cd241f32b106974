"""Stand in for `python ARGS` started by multiprocessing's spawn: the spawn server forks the real process instead.

Run as `python -I -S spawn_trampoline.py SOCKET ARGS...` (the executable that tests/helpers/spawn_server.py writes
and `multiprocessing.set_executable` names), with only the standard library imported. It hands ARGS, its
environment, working directory and every open descriptor (SCM_RIGHTS) to the server on SOCKET, which forks a child
of its preloaded image that takes them at the same numbers. It then lives exactly as long as that child: it
forwards the signals a parent sends (SIGTERM, SIGINT...), and exits with the child's status (a signal's death as
that signal). If it is killed, its socket closes and the server kills the child. When the server cannot run ARGS
as a fresh interpreter would (no server, other load-time settings, interpreter options), it becomes
`python ARGS` itself (execv): a cold start, never a different process.

    parent (vLLM) --fork_exec--> trampoline --SEQPACKET: argv, env, cwd + fds--> spawn server --fork--> child
                                   <------------------- "pid N" -------------------
                                   <------------------- "exit N" ------------------   (child reaped by the server)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from types import FrameType
from typing import TypedDict

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
MAX_MESSAGE_BYTES = 1 << 20  # a request (argv and environment) is a few KiB; the server refuses more
MAX_FDS = 64


class SpawnRequest(TypedDict):
    """What the trampoline sends (as JSON, the descriptors beside it): `fds` are their numbers in the child."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]


class Forwarder:
    """Signals that arrive before the child's pid is known are kept and sent once it is."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.pid is None:
            self.pending.append(signum)
        else:
            _send(self.pid, signum)

    def attach(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            _send(pid, signum)
        self.pending.clear()


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it exited; its status is on the way


def open_fds() -> list[int]:
    """This process's open descriptors (those a spawned child got: 0-2 and the ones its parent passed)."""
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    fds = []
    for fd in listed:  # one of them was listdir's own, closed by now
        try:
            os.fstat(fd)
        except OSError:
            continue
        fds.append(fd)
    return sorted(fds)


def become_python(args: list[str], reason: str, pending: list[int]) -> None:
    """`python ARGS` in this process (the cold start), after the signals that already came."""
    print(f"spawn trampoline: starting a fresh interpreter ({reason})", file=sys.stderr, flush=True)
    for signum in pending:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os.execv(sys.executable, [sys.executable, *args])


def die_as(code: int) -> None:
    """Exit as the child did: with its code, or killed by the same signal (negative code)."""
    sys.stdout.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def request(server: socket.socket, args: list[str], fds: list[int]) -> str:
    message: SpawnRequest = {"argv": args, "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds}
    body = json.dumps(message).encode()
    socket.send_fds(server, [body], fds)
    return server.recv(MAX_MESSAGE_BYTES).decode()


def main(argv: list[str]) -> None:
    path, args = argv[1], argv[2:]
    forwarder = Forwarder()
    for signum in FORWARDED:
        signal.signal(signum, forwarder)
    fds = open_fds()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        server.connect(path)
        answer = request(server, args, fds)
    except OSError as error:
        become_python(args, f"spawn server at {path}: {error}", forwarder.pending)
        return
    kind, _, value = answer.partition(" ")
    if kind != "pid":
        server.close()
        become_python(args, value or "the spawn server closed", forwarder.pending)
        return
    for fd in fds:  # the child holds them now: a pipe's end closes when the child's does, as with a spawned child
        if fd > 2:
            os.close(fd)
    forwarder.attach(int(value))
    answer = server.recv(MAX_MESSAGE_BYTES).decode()
    kind, _, value = answer.partition(" ")
    die_as(int(value) if kind == "exit" else 1)


if __name__ == "__main__":
    main(sys.argv)
