"""Start test child processes (daemons, client programs) in milliseconds instead of seconds.

A fresh interpreter spends about 2 s of CPU importing torch and the web stack before a daemon reads
its config (10 s on this loaded 2-core machine). The fork server is one process that imports those
third-party libraries once, then forks a child per request; the child sets its own environment,
working directory and output files and runs `python -c CODE ARGS` or `python -m MODULE ARGS` as a
fresh interpreter would. Nothing of the project is imported before the fork, so every child reads
its environment (KVSTORE_PURE_PYTHON, KVSTORE_CACHE_DIR, ...) and the worktree's code as a new process.

    test process                      fork server (python -m tests.helpers.forkserver)
      ForkServer.spawn  --- JSON line --->  fork -> child: env, cwd, fds, reseed, run, os._exit
                        <--- "pid N" ----
      reader thread     <--- "exit N CODE" (the server reaps its children and reports each status)
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from service.process import ChildProcess
from tests.helpers import forked_child

ROOT = Path(__file__).resolve().parents[2]
# Imported once by the server (third-party only: the project's modules read the environment on import).
# torch and numexpr start native threads on import; a forked child has none of them, which both
# libraries handle, as DataLoader workers rely on (blosc2 and numexpr re-create their pools in the child).
PRELOAD = ("torch", "numpy", "fastapi", "starlette", "uvicorn", "httpx", "typer", "pydantic", "rich", "msgpack",
           "blosc2", "numexpr")
REAP_EVERY_S = 0.02


class ForkedProcess:
    """A child of the fork server, with subprocess.Popen's names: pid, returncode, poll, wait, send_signal, kill."""

    def __init__(self, server: ForkServer, pid: int, argv: list[str]) -> None:
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.returncode = code
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may have been reused
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The test side: starts the server on first use, sends requests, hears of exits on a reader thread.
    Disabled (`enabled=False`), or for a child with another PYTHONPATH, it starts fresh interpreters instead."""

    def __init__(self, log: Path, *, enabled: bool = True, preload: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, start_timeout_s: float = 120.0) -> None:
        """`preload`: modules the server imports beside PRELOAD (third-party only); `env`: the server's environment
        (this process's when None), read by those imports; `start_timeout_s`: how long the first answer may take
        (the server imports before it answers)."""
        self.enabled = enabled
        self._log = log
        self._preload = preload
        self._env = env
        self._start_timeout_s = start_timeout_s
        self._first_answer = True
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()  # one request at a time: its "pid" answer is the next started line
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._started: list[int] = []
        self._python_path = (os.environ if env is None else env).get("PYTHONPATH", "")

    def spawn(self, argv: list[str], *, env: dict[str, str] | None = None, stdout: Path, stderr: Path | None = None,
              cwd: Path | None = None, append: bool = True, new_session: bool = False) -> ChildProcess:
        """Start `python ARGV` (ARGV starting with -c CODE or -m MODULE), stdout and stderr into files
        (stderr into stdout's file when None); `new_session`: as Popen's start_new_session (the child leads a
        process group of its own, which os.killpg(child.pid) ends)."""
        env = dict(os.environ) if env is None else env
        if not self.enabled or env.get("PYTHONPATH", "") != self._python_path:
            return _popen(argv, env=env, stdout=stdout, stderr=stderr, cwd=cwd, append=append, new_session=new_session)
        for path in (stdout, stderr):  # there before spawn returns, as with Popen (the child opens them after the fork)
            if path is not None:
                path.touch()
        request = {"argv": argv, "env": env, "cwd": str(cwd or Path.cwd()), "stdout": str(stdout),
                   "stderr": str(stderr) if stderr else None, "append": append, "new_session": new_session}
        with self._lock:
            proc = self._server()
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            pid = self._next_started(proc)
        return ForkedProcess(self, pid, argv)

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 120.0,
            ) -> subprocess.CompletedProcess[str]:
        """`python ARGV` to its end, as subprocess.run(capture_output=True, text=True) answers it."""
        with tempfile.TemporaryDirectory(prefix="forked-") as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            proc = self.spawn(argv, env=env, stdout=out, stderr=err, append=False)
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
                raise
            return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())

    def start(self) -> None:
        """Start the server now (it imports in the background while the first tests run); else on first use."""
        if self.enabled:
            with self._lock:
                self._server()

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or not self._alive(), timeout)
            return self._exits.get(pid)

    def close(self) -> None:
        """End the server; it kills whatever children are still running (a test that forgot one)."""
        if self._proc is None:
            return
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=30)

    def _server(self) -> subprocess.Popen[str]:
        if self._proc is None:
            with self._log.open("ab") as log:
                self._proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.forkserver", *self._preload],
                                              cwd=ROOT, env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=log, text=True)
            threading.Thread(target=self._read, args=(self._proc.stdout,), name="forkserver-reader",
                             daemon=True).start()
        return self._proc

    def _next_started(self, proc: subprocess.Popen[str]) -> int:
        with self._changed:
            timeout_s = self._start_timeout_s if self._first_answer else 120.0
            if not self._changed.wait_for(lambda: self._started or not self._alive(), timeout=timeout_s):
                raise RuntimeError(f"fork server did not answer in {timeout_s:.0f} s; its log: {self._log}")
            self._first_answer = False
            if not self._started:
                raise RuntimeError(f"fork server exited with {proc.returncode}:\n{self._log.read_text()[-3000:]}")
            return self._started.pop(0)

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            kind, *numbers = line.split() or [""]
            with self._changed:
                if kind == "pid":
                    self._started.append(int(numbers[0]))
                elif kind == "exit":
                    self._exits[int(numbers[0])] = int(numbers[1])
                self._changed.notify_all()
        with self._changed:  # the server is gone: wake every waiter
            self._changed.notify_all()


def _popen(argv: list[str], *, env: dict[str, str], stdout: Path, stderr: Path | None, cwd: Path | None,
           append: bool, new_session: bool) -> ChildProcess:
    mode = "ab" if append else "wb"
    with stdout.open(mode) as out, (stderr.open(mode) if stderr else open(os.devnull, "wb")) as err:
        return subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err if stderr else subprocess.STDOUT,
                                env=env, cwd=cwd, start_new_session=new_session)


def _requests(fd: int) -> Iterator[dict[str, Any] | None]:
    """Each complete JSON line on `fd`, or None when nothing came within a reaping interval; ends at EOF."""
    buffer = b""
    while True:
        ready, _, _ = select.select([fd], [], [], REAP_EVERY_S)
        if not ready:
            yield None
            continue
        data = os.read(fd, 1 << 16)
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)


def _say(out: int, text: str) -> None:
    os.write(out, (text + "\n").encode())


def _reap(out: int, children: set[int]) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        _say(out, f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def serve() -> None:
    """The server's loop: fork a child per request, report each child's exit, kill the rest at EOF."""
    out = os.dup(1)  # answers on a private descriptor; anything a library prints goes to the log
    os.dup2(2, 1)
    for name in (*PRELOAD, *sys.argv[1:]):  # the argv: the ForkServer's `preload`
        # Only a head start: one a fresh environment lacks (blosc2 4.15 no longer pulls numexpr) is not preloaded.
        if importlib.util.find_spec(name.partition(".")[0]) is not None:
            __import__(name)
    children: set[int] = set()
    for request in _requests(0):
        if request is not None:
            pid = os.fork()
            if pid == 0:
                forked_child.run(request)  # never returns
            children.add(pid)
            _say(out, f"pid {pid}")
        _reap(out, children)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    while children:
        pid, status = os.waitpid(-1, 0)
        children.discard(pid)
    sys.stderr.flush()
    os._exit(0)  # without the interpreter's teardown of what PRELOAD imported (seconds, with vLLM loaded)


if __name__ == "__main__":
    serve()
