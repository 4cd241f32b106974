"""Run `kvstore serve` as a child process: write a config, start on a free port, wait for ready, stop.

Used by the tests, the service benchmark and demos that drive an engine against a real daemon.
A fresh interpreter spends most of a daemon's start-up importing torch (about 2 s of CPU, 10 s on a
loaded 2-core machine) before the config is even checked; the test suite swaps in a launcher that
forks daemons from a process that imported the third-party libraries once (`use_launcher`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import httpx

from kvstore.layout import KVLayout
from service.exposition import sample

logger = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def write_config(root: Path, *, layout: KVLayout, host_chunks: int = 16, nvme_chunks: int = 256,
                 service: Mapping[str, object] | None = None, tenants: Sequence[Mapping[str, object]] | None = None,
                 any_layout: bool = False) -> Path:
    """A daemon config under `root`: tiers sized in chunks of `layout`, which is also the daemon's one layout,
    or with `any_layout` only the sizing unit (no model or [layout] written: it serves every model that
    registers)."""
    lines = ["put_timeout_s = 3.0"]
    if not any_layout:
        lines = ['model_id = "svc-test"', *lines, "[layout]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in layout.to_dict().items()]
    lines += ["[[tiers]]", 'kind = "host"', f"capacity = '{host_chunks * layout.chunk_bytes}B'"]
    if nvme_chunks:
        lines += ["[[tiers]]", 'kind = "nvme"', f"capacity = '{nvme_chunks * (layout.chunk_bytes + 8192)}B'",
                  f'path = "{root / "nvme"}"']
    lines += ["[service]"] + [f"{k} = {_toml_value(v)}" for k, v in (service or {}).items()]
    for tenant in tenants or []:
        lines += ["[[service.tenants]]"] + [f"{k} = {_toml_value(v)}" for k, v in tenant.items()]
    path = root / "kvstore.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


CLI = ["-c", "from kvstore.cli import app; app()"]  # the `kvstore` command, for `python CLI ARGS...`


def serve_command_line(config: Path, *args: str) -> list[str]:
    """The command that runs `kvstore serve --config CONFIG ARGS...` with this interpreter."""
    return [sys.executable, *CLI, "serve", "--config", str(config), *args]


class ChildProcess(Protocol):
    """What Daemon needs of its process: subprocess.Popen's names and meanings (returncode -N: killed by signal N)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


# (the `kvstore` command's arguments, the environment, the log file for stdout and stderr) -> the running child
Launcher = Callable[[list[str], dict[str, str], Path], ChildProcess]


def popen_launcher(args: list[str], env: dict[str, str], log: Path, *, prefix: tuple[str, ...] = ()) -> ChildProcess:
    """`kvstore ARGS...` in a fresh interpreter (this one's), under `prefix` if given, output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen([*prefix, sys.executable, *CLI, *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


_launcher: Launcher = popen_launcher


def use_launcher(launcher: Launcher) -> Launcher:
    """Start every later Daemon with `launcher`; returns the one it replaces (to put back)."""
    global _launcher
    previous, _launcher = _launcher, launcher
    return previous


class Daemon:
    """One `kvstore serve` process on a free TCP port (or a unix socket); start, stop (SIGTERM), kill."""

    def __init__(self, config: Path, log: Path, *, uds: Path | None = None, prefix: tuple[str, ...] = ()) -> None:
        """`prefix`: a command the daemon runs under (e.g. setpriv dropping every capability)."""
        self.config = config
        self.prefix = prefix
        self.log = log
        self.uds = uds
        self.port = free_port()
        self.url = f"unix://{uds}" if uds else f"http://127.0.0.1:{self.port}"
        self.proc: ChildProcess | None = None

    def start(self, timeout_s: float = 60.0) -> Daemon:
        """Start and wait for /healthz (the daemon answers only once its index is rebuilt). A daemon not ready in
        `timeout_s` is killed before the error is raised: nothing is left running."""
        where = ["--uds", str(self.uds)] if self.uds else ["--port", str(self.port)]
        args = ["serve", "--config", str(self.config), *where, "--log-level", "warning"]
        env = {**os.environ, "KVSTORE_CACHE_DIR": str(self.config.parent / "cache")}
        # Under a prefix command (setpriv) the daemon is that command's child: always a fresh interpreter.
        self.proc = popen_launcher(args, env, self.log, prefix=self.prefix) if self.prefix else _launcher(args, env, self.log)
        end = time.monotonic() + timeout_s
        with self.client() as http:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
                try:
                    if http.get("/healthz", timeout=1.0).status_code == 200:
                        logger.info("daemon ready at %s", self.url)
                        return self
                except httpx.TransportError:
                    time.sleep(0.05)
        self.close()
        raise RuntimeError(f"daemon not ready in {timeout_s} s (stopped):\n{self.log.read_text()[-3000:]}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM; returns the exit status (0 after a clean drain)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()

    def client(self, token: str | None = None) -> httpx.Client:
        """A plain httpx client on the daemon (for raw requests)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if self.uds:
            return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.uds)), base_url="http://kvstore",
                                headers=headers, timeout=30.0)
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def metric(self, name: str, **labels: str) -> float:
        """The value of sample `name` with exactly `labels` in /metrics (0.0 when there is none)."""
        with self.client() as http:
            return sample(http.get("/metrics", timeout=10).text, name, **labels)
