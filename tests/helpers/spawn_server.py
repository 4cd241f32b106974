"""Start multiprocessing's spawned children (vLLM's engine core and worker) from a preloaded image, not a new one.

vLLM on CPU starts its engine core and worker with the "spawn" method: each a new interpreter that imports vLLM
again (17 s of CPU each here). The spawn server is one process that imported those modules once, under the
environment such a child starts with. A process that sets `multiprocessing.set_executable(server.executable)`
spawns through tests/helpers/spawn_trampoline.py instead of `python`; the trampoline hands its argv, environment,
directory and descriptors to this server, which forks a child (tests/helpers/spawned_child.py) that takes them
and runs spawn's `-c` code. The server runs a request as a fresh interpreter would, or not at all: one whose
load-time settings (LD_PRELOAD, PYTHONPATH, OMP_*, ...) differ from its own, or with interpreter options, is
answered "fallback" and the trampoline starts `python` itself. Its children spawn through it too.

    test process: SpawnServer --stdin (EOF: stop)--> python -m tests.helpers.spawn_server SOCKET PRELOAD...
                                                       listens on SOCKET; per request: fork -> spawned_child.run
                                                       child exits   -> "exit CODE" to its trampoline
                                                       trampoline gone -> SIGKILL to the child's group
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import spawn_trampoline, spawned_child
from tests.helpers.spawn_trampoline import MAX_FDS, MAX_MESSAGE_BYTES, SpawnRequest
from tests.helpers.waits import wait_until

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
REAP_EVERY_S = 0.02
MAX_SOCKET_PATH = 107  # sun_path's 108 bytes, NUL included
# Read when a process starts or a library loads (the dynamic loader, the interpreter, OpenMP, malloc, torch's
# config modules): a child forked from an image loaded under other values would not be the process asked for.
LOAD_TIME_PREFIXES = ("LD_", "PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "MALLOC_", "TCMALLOC_",
                      "NUMEXPR_", "TORCH", "VLLM_LOGGING", "VLLM_CONFIGURE_LOGGING")


def load_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(LOAD_TIME_PREFIXES)}


def fallback_reason(request: SpawnRequest, image_env: dict[str, str], image_options: list[str]) -> str | None:
    """Why the image cannot be this request's process (None: it can). `image_options`: the server's own
    interpreter options as spawn writes them (-B, -X ...); a request must have the same before its -c."""
    argv = request["argv"]
    options = argv[:argv.index("-c")] if "-c" in argv else argv
    if options != image_options:
        return f"interpreter options {options} (the image's: {image_options}), or no `-c CODE`"
    wanted, loaded = load_time_env(request["env"]), load_time_env(image_env)
    differ = sorted(k for k in wanted.keys() | loaded.keys() if wanted.get(k) != loaded.get(k))
    return f"load-time settings differ from the image's: {', '.join(differ)}" if differ else None


class SpawnServer:
    """The test side: writes the executable, starts the server (it imports `preload` under `env`), stops it.
    Disabled, it starts nothing and `executable` is None."""

    def __init__(self, folder: Path, log: Path, *, preload: tuple[str, ...], env: dict[str, str],
                 enabled: bool = True) -> None:
        """`folder`: where its socket and executable go (a short path: a socket's has at most 107 bytes)."""
        self.enabled = enabled
        self.socket_path = folder / "spawn.sock"
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(f"spawn server socket path {self.socket_path} is over {MAX_SOCKET_PATH} bytes; "
                             f"give a shorter folder")
        self.log = log
        self.folder = folder
        self._preload = preload
        self._env = env
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def executable(self) -> Path | None:
        """What `multiprocessing.set_executable` takes: the trampoline, bound to this server's socket."""
        return self.folder / "spawn-python" if self.enabled else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the server and wait until it listens (it imports after that; requests wait for the imports).

        Raises:
            RuntimeError: it exited or did not listen within timeout_s (its log's tail in the message).
        """
        if not self.enabled or self._proc is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        script = self.folder / "spawn-python"
        script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S "
                          f"{shlex.quote(spawn_trampoline.__file__)} {shlex.quote(str(self.socket_path))} \"$@\"\n")
        script.chmod(0o755)
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.spawn_server", str(self.socket_path),
                                           str(script), *self._preload], cwd=ROOT, env=self._env,
                                          stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        proc = self._proc
        if not wait_until(lambda: self.socket_path.exists() or proc.poll() is not None, timeout_s):
            self.close()
            raise RuntimeError(f"spawn server not listening after {timeout_s:.0f} s:\n{self.log.read_text()[-3000:]}")
        if proc.poll() is not None:
            self._proc = None
            raise RuntimeError(f"spawn server exited with {proc.returncode}:\n{self.log.read_text()[-3000:]}")

    def close(self) -> None:
        """Stop the server; it kills the children still running."""
        if self._proc is None:
            return
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._proc = None


@dataclass
class Children:
    """The server's connections: those waiting for their request, and those whose child runs (both ways)."""

    pending: set[socket.socket] = field(default_factory=set)
    pid_to_conn: dict[int, socket.socket] = field(default_factory=dict)
    conn_to_pid: dict[socket.socket, int] = field(default_factory=dict)

    def connections(self) -> list[socket.socket]:
        return [*self.pending, *self.conn_to_pid]

    def add(self, pid: int, conn: socket.socket) -> None:
        self.pending.discard(conn)
        self.pid_to_conn[pid] = conn
        self.conn_to_pid[conn] = pid

    def exited(self, pid: int, code: int) -> None:
        logger.info("child %d exited with %d", pid, code)
        conn = self.pid_to_conn.pop(pid, None)
        if conn is not None:
            del self.conn_to_pid[conn]
            _answer(conn, f"exit {code}")
            conn.close()

    def abandoned(self, conn: socket.socket) -> None:
        """The trampoline closed its end (killed, or gone after a fallback): its child and what that started go."""
        self.pending.discard(conn)
        pid = self.conn_to_pid.pop(conn, None)
        conn.close()
        if pid is not None:
            del self.pid_to_conn[pid]
            _kill_group(pid)

    def kill_all(self) -> None:
        for pid in self.pid_to_conn:
            _kill_group(pid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _answer(conn: socket.socket, text: str) -> None:
    try:
        conn.send(text.encode())
    except OSError:
        pass  # the trampoline is gone; its end of the story is the closed connection


def _reap(children: Children) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.exited(pid, os.waitstatus_to_exitcode(status))


@dataclass(frozen=True, slots=True)
class Image:
    """What the server's processes start with: its environment and interpreter options."""

    env: dict[str, str]
    options: list[str]


def _on_readable(conn: socket.socket, children: Children, image: Image) -> None:
    try:
        body, received, _, _ = socket.recv_fds(conn, MAX_MESSAGE_BYTES, MAX_FDS)
    except OSError:
        body, received = b"", []
    try:
        if not body:
            children.abandoned(conn)
        elif conn in children.pending:
            _start(conn, json.loads(body), received, children, image)
        else:
            logger.warning("spawn server: a second message from the trampoline of %d ignored", children.conn_to_pid[conn])
    finally:
        for fd in received:
            os.close(fd)


def _start(conn: socket.socket, request: SpawnRequest, received: list[int], children: Children, image: Image) -> None:
    reason = fallback_reason(request, image.env, image.options)
    if reason is not None:
        logger.warning("spawn fallback: %s", reason)
        _answer(conn, f"fallback {reason}")
        return
    sys.stdout.flush()
    sys.stderr.flush()
    server_pid = os.getpid()
    argv = request["argv"]
    pid = os.fork()
    if pid == 0:
        spawned_child.run({**request, "argv": argv[argv.index("-c"):]}, received, server_pid)  # never returns
    _set_group(pid)
    logger.info("child %d started: -c %.90s", pid, argv[argv.index("-c") + 1])
    children.add(pid, conn)
    _answer(conn, f"pid {pid}")


def _set_group(pid: int) -> None:
    """The child's own group, set from both sides (whichever runs first), so a kill right away reaches it."""
    try:
        os.setpgid(pid, pid)
    except (PermissionError, ProcessLookupError):
        pass  # the child already exec'd or exited; it set its group itself


def serve(socket_path: str, executable: str, preload: list[str]) -> None:
    """Listen on `socket_path`, import `preload`, then fork a child per request until stdin ends. Requests that
    come while the imports run wait for them (in the listen queue): they are what the server is for."""
    image = Image(dict(os.environ), subprocess._args_from_interpreter_flags())  # type: ignore[attr-defined]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    listener.bind(socket_path)
    listener.listen(64)
    for name in preload:
        importlib.import_module(name)
    multiprocessing.set_executable(executable)  # the children's own spawns come back here
    logger.info("spawn server %d ready on %s (%d modules preloaded, %d threads)", os.getpid(), socket_path,
                len(preload), len(os.listdir("/proc/self/task")))
    children = Children()
    while True:
        watched: list[int | socket.socket] = [0, listener, *children.connections()]
        ready, _, _ = select.select(watched, [], [], REAP_EVERY_S)
        if 0 in ready and not os.read(0, 4096):
            break
        if listener in ready:
            children.pending.add(listener.accept()[0])
        for conn in ready:
            if isinstance(conn, socket.socket) and conn is not listener:
                _on_readable(conn, children, image)
        _reap(children)
    children.kill_all()
    listener.close()
    os.unlink(socket_path)
    os._exit(0)  # without the interpreter's teardown of what was preloaded


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(sys.argv[1], sys.argv[2], sys.argv[3:])
