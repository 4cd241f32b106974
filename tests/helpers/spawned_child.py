"""The spawn server's child: take the trampoline's descriptors, environment and directory, run its ARGV, exit.

What a new `python -c CODE` started by multiprocessing's spawn would be, except that the imports are done: the
descriptors at their numbers (0-2 and the ones its parent passed, nothing of the server's), the environment
(os.environ and the C one), the working directory, fresh random state, the default signal dispositions; at the
end, as the interpreter does: non-daemon threads joined, atexit handlers run, streams flushed.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import os
import signal
import sys
import threading
import traceback
from typing import NoReturn

from tests.helpers import forked_child
from tests.helpers.spawn_trampoline import FORWARDED, SpawnRequest

PR_SET_PDEATHSIG = 1  # prctl(2)


def run(request: SpawnRequest, received: list[int], server_pid: int) -> NoReturn:
    """Become the process the trampoline stands for and run its ARGV; never returns."""
    code, interrupted = 1, False
    try:
        _become_fresh(request, received, server_pid)
        forked_child.run_argv(request["argv"])
        code = 0
    except SystemExit as stop:
        code = forked_child.exit_status(stop.code)
    except KeyboardInterrupt:  # as the interpreter: an unhandled ^C ends the process by SIGINT
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
    finally:
        _finalize()
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _become_fresh(request: SpawnRequest, received: list[int], server_pid: int) -> None:
    os.setpgid(0, 0)  # a group of its own: the server ends it and what it started when the trampoline dies
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:  # and if the server dies
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != server_pid:
        os._exit(1)  # the server died before prctl
    install_fds(request["fds"], received)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    for signum in (*FORWARDED, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it at start
    forked_child.reseed()


def install_fds(targets: list[int], received: list[int]) -> None:
    """received[i] at number targets[i] (inheritable, as a spawned child's), every other descriptor closed."""
    above = max([*targets, *received], default=2) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for fd in received]  # out of the targets' way
    for source, target in zip(moved, targets, strict=True):
        os.dup2(source, target, inheritable=True)
    keep = set(targets)
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # listdir's own descriptor, closed already


def _finalize() -> None:
    """What the interpreter does at exit before its teardown: join non-daemon threads, atexit, flush."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
