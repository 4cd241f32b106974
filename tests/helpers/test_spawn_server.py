"""The spawn server and its trampoline (tests/helpers/spawn_server.py) with real processes: multiprocessing's spawn
context started through the trampoline, a child forked by the server, real signals. No vLLM: the integration
suite uses them for vLLM's engine core and worker."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from tests.helpers.spawn_server import SpawnServer, fallback_reason
from tests.helpers.spawn_trampoline import SpawnRequest
from tests.helpers.waits import wait_until

EXIT_CODE = 7


def report_and_exit(conn: Connection) -> None:
    """The child: what it got, through a descriptor its parent passed; then an exit status of its own."""
    conn.send({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "marker": os.environ.get("SPAWN_MARKER"),
               "c_marker": os.popen("echo $SPAWN_MARKER").read().strip()})
    conn.close()
    sys.exit(EXIT_CODE)


def report_and_sleep(conn: Connection) -> None:
    conn.send(os.getpid())
    conn.close()
    time.sleep(300)


@pytest.fixture
def server() -> Iterator[SpawnServer]:
    """A spawn server (nothing preloaded) that this process's spawns go through while the test runs."""
    with tempfile.TemporaryDirectory(prefix="spawn-") as folder:  # short: a unix socket's path has 107 bytes
        server = SpawnServer(Path(folder), Path(folder) / "spawn_server.log", preload=(), env=dict(os.environ))
        yield from _serving(server)


def _serving(server: SpawnServer) -> Iterator[SpawnServer]:
    resource_tracker.ensure_running()  # a plain child of this process: one started through the server ends with it
    server.start()
    assert server.executable is not None
    multiprocessing.set_executable(str(server.executable))
    try:
        yield server
    finally:
        multiprocessing.set_executable(sys.executable)
        server.close()


def spawn(target: Callable[[Connection], None]) -> tuple[multiprocessing.process.BaseProcess, Connection]:
    context = multiprocessing.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    proc = context.Process(target=target, args=(writer,))
    proc.start()
    writer.close()
    return proc, reader


def test_a_child_gets_its_descriptors_environment_directory_and_exit_status(
        server: SpawnServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPAWN_MARKER", "set-after-the-server-started")
    monkeypatch.chdir(tmp_path)
    proc, reader = spawn(report_and_exit)
    got = reader.recv()  # the pipe's write end reached the child at the number spawn gave it
    proc.join(60)
    assert proc.exitcode == EXIT_CODE
    assert got["ppid"] == server.pid, "forked by the server, not a fresh interpreter"
    assert got["pid"] != proc.pid
    assert got["cwd"] == str(tmp_path)
    assert got["marker"] == got["c_marker"] == "set-after-the-server-started"


def test_sigterm_to_the_trampoline_reaches_the_child(server: SpawnServer) -> None:
    proc, reader = spawn(report_and_sleep)
    child_pid = reader.recv()
    proc.terminate()
    proc.join(60)
    assert proc.exitcode == -signal.SIGTERM, "the child died of SIGTERM, and the trampoline as it did"
    assert wait_until(lambda: not Path(f"/proc/{child_pid}").exists())


def test_killing_the_trampoline_kills_the_child(server: SpawnServer) -> None:
    proc, reader = spawn(report_and_sleep)
    child_pid = reader.recv()
    proc.kill()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    assert wait_until(lambda: not Path(f"/proc/{child_pid}").exists()), "the server killed the orphaned child"


def test_other_load_time_settings_start_a_fresh_interpreter(server: SpawnServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # read when OpenMP loads: the server's image cannot have it
    proc, reader = spawn(report_and_exit)
    got = reader.recv()
    proc.join(60)
    assert proc.exitcode == EXIT_CODE
    assert got["pid"] == proc.pid, "the trampoline became the interpreter itself"


def test_fallback_names_what_differs() -> None:
    request: SpawnRequest = {"argv": ["-c", "pass"], "env": {"LD_PRELOAD": "libtcmalloc.so", "HOME": "/a"},
                             "cwd": "/", "fds": [0, 1, 2]}
    assert fallback_reason(request, {"HOME": "/b"}, []) == "load-time settings differ from the image's: LD_PRELOAD"
    assert fallback_reason(request, {"LD_PRELOAD": "libtcmalloc.so"}, []) is None
    with_options: SpawnRequest = {**request, "argv": ["-B", "-c", "pass"]}
    assert fallback_reason(with_options, {"LD_PRELOAD": "libtcmalloc.so"}, ["-B"]) is None
    assert "interpreter options ['-B']" in str(fallback_reason(with_options, {"LD_PRELOAD": "libtcmalloc.so"}, []))
