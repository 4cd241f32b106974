"""The fork server's child: become the process a fresh `python ARGV` would be, run ARGV, exit with its status."""

from __future__ import annotations

import atexit
import os
import random
import runpy
import sys
import traceback
from typing import Any


def run(request: dict[str, Any]) -> None:
    """Set up fds, environment, working directory and random state as a new process has them, run, `os._exit`."""
    code = 1
    try:
        _become_fresh(request)
        run_argv(request["argv"])
        code = 0
    except SystemExit as stop:
        code = exit_status(stop.code)
    except BaseException:  # as the interpreter: print the traceback, exit 1
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _become_fresh(request: dict[str, Any]) -> None:
    if request["new_session"]:
        os.setsid()
    mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request["append"] else os.O_TRUNC)
    out = os.open(request["stdout"], mode, 0o644)
    err = os.open(request["stderr"], mode, 0o644) if request["stderr"] else out
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(source, target)
    os.closerange(3, 1 << 16)  # nothing of the server's (its pipes) stays open in the child
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]
    reseed()


def reseed() -> None:
    """A forked child inherits the server's random state; a new process draws its own."""
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


def run_argv(argv: list[str]) -> None:
    flag, target, *args = argv
    if flag == "-c":
        sys.argv = ["-c", *args]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    elif flag == "-m":
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        raise ValueError(f"fork server runs `-c CODE ...` or `-m MODULE ...`, not {flag!r}")


def exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
