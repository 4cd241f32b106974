"""A real `kvstore serve` subprocess on a free port, with its config file on tmp_path."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore.layout import KVLayout

# 2 layers x 2 planes x 16 tokens x 2 heads x 32 dims x 2 bytes = 8 KiB per chunk
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="float16", chunk_tokens=16)
TOKENS = {"a": "token-aaaa-1234", "b": "token-bbbb-5678", "q": "token-qqqq-9999"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def write_config(root: Path, *, layout: KVLayout = LAYOUT, host_chunks: int = 16, nvme_chunks: int = 256,
                 service: dict[str, Any] | None = None, tenants: list[dict[str, Any]] | None = None) -> Path:
    lines = ['model_id = "svc-test"', "put_timeout_s = 3.0", "[layout]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in layout.to_dict().items()]
    lines += ["[[tiers]]", 'kind = "host"', f"capacity = {host_chunks * layout.chunk_bytes}"]
    lines += ["[[tiers]]", 'kind = "nvme"', f"capacity = {nvme_chunks * (layout.chunk_bytes + 8192)}",
              f'path = "{root / "nvme"}"']
    lines += ["[service]"] + [f"{k} = {_toml_value(v)}" for k, v in (service or {}).items()]
    for tenant in tenants or []:
        lines += ["[[service.tenants]]"] + [f"{k} = {_toml_value(v)}" for k, v in tenant.items()]
    path = root / "kvstore.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Daemon:
    """One `kvstore serve` process; `start`, `stop` (SIGTERM), `kill` (SIGKILL), `restart`."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> Daemon:
        cmd = [sys.executable, "-c", "from kvstore.cli import app; app()", "serve", "--config", str(self.config),
               "--port", str(self.port), "--log-level", "warning"]
        env = {**os.environ, "KVSTORE_CACHE_DIR": str(self.config.parent / "cache")}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"daemon not ready in {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def stop(self, timeout_s: float = 30.0) -> int:
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
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def metric(self, name: str) -> float:
        """The value of one metric line (`name` with its labels, exactly as printed)."""
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0


def start_daemon(root: Path, **config: Any) -> Daemon:
    return Daemon(write_config(root, **config), root / "daemon.log").start()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    """A shared daemon without auth (the anonymous tenant may use shared memory); leases last 3 s."""
    root = tmp_path_factory.mktemp("daemon")
    d = start_daemon(root, service={"lease_s": 3.0})
    yield d
    d.close()


@pytest.fixture(scope="session")
def tenant_daemon(tmp_path_factory):
    """A shared daemon with three tenants: a (shm), b (HTTP only), q (quota of 4 chunks)."""
    root = tmp_path_factory.mktemp("tenants")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
               {"name": "b", "token": TOKENS["b"], "salt": "salt-b"},
               {"name": "q", "token": TOKENS["q"], "salt": "salt-q",
                "quota": {"host": 4 * LAYOUT.chunk_bytes, "nvme": 64 * LAYOUT.chunk_bytes}}]
    d = start_daemon(root, tenants=tenants, service={"max_body_bytes": 1 << 20, "max_batch_chunks": 64})
    yield d
    d.close()
