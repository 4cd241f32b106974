"""Real redis-server processes for the cluster tests: one per session, plus killable ones per test."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from service.process import Daemon, write_config
from tests.service.conftest import LAYOUT

REDIS_BINARY = shutil.which("redis-server")
MISSING = "redis-server is not installed (apt-get install redis-server; scripts/test.sh does it in CI)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(100):
        port = random.randrange(20_000, 50_000)
        try:
            for candidate in (port, port + 10_000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisServer:
    """One redis-server on 127.0.0.1:port with no persistence; can be killed and started again on the same port."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        assert REDIS_BINARY is not None
        self.process = subprocess.Popen(
            [REDIS_BINARY, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--proto-max-bulk-len", "1gb"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.02)
        client.close()
        return self

    def kill(self) -> None:
        """SIGKILL: the data in it is gone, like a crashed Redis without persistence."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if REDIS_BINARY is None:
        pytest.skip(MISSING)
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, emptied before each test."""
    with redis_server.client() as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def make_redis_server(tmp_path: Path) -> Iterator[Callable[[], RedisServer]]:
    """A fresh server of a test's own (for killing it); stopped at teardown."""
    if REDIS_BINARY is None:
        pytest.skip(MISSING)
    made: list[RedisServer] = []

    def factory() -> RedisServer:
        server = RedisServer(tmp_path / f"redis{len(made)}").start()
        made.append(server)
        return server

    yield factory
    for server in made:
        server.kill()


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real 3-primary Redis Cluster (cluster-enabled redis-servers joined by redis-cli --cluster create)."""
    cli = shutil.which("redis-cli")
    if REDIS_BINARY is None or cli is None:
        pytest.skip(MISSING)
    root = tmp_path_factory.mktemp("redis-cluster")
    ports = [free_cluster_port() for _ in range(3)]
    procs = [subprocess.Popen([REDIS_BINARY, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                               "--cluster-config-file", f"nodes-{port}.conf", "--save", "", "--appendonly", "no",
                               "--dir", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for port in ports]
    try:
        for port, proc in zip(ports, procs, strict=True):
            _wait_ping(port, proc)
        created = subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                                  "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True, timeout=30)
        if created.returncode != 0:
            pytest.skip(f"could not form a Redis Cluster here: {created.stdout[-300:]} {created.stderr[-300:]}")
        client = redis.Redis(port=ports[0])
        deadline = time.monotonic() + 10
        while client.cluster("info").get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                pytest.skip("Redis Cluster did not reach cluster_state:ok in 10 s")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _wait_ping(port: int, proc: subprocess.Popen) -> None:
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not start") from None
            time.sleep(0.02)


def stalled_redis_daemon(root: Path, tenants: list[dict], admin: str, cap: int,
                         prefix: str) -> Iterator[tuple[subprocess.Popen[bytes], Daemon]]:
    """A redis-server (no persistence) and a daemon whose Redis tier (socket timeout 60 s: a call that
    reaches a paused Redis waits until SIGCONT) sits under a 16-chunk host tier; deadlines of 0.3 s
    (requests) and 0.5 s (puts), at most `cap` abandoned calls. Yields (redis process, daemon); resumes
    Redis before stopping both. For the module fixtures of the tests that pause Redis with SIGSTOP."""
    if REDIS_BINARY is None:
        pytest.skip(MISSING)
    port = free_port()
    proc = subprocess.Popen([REDIS_BINARY, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(root)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_ping(port, proc)
    config = write_config(root, layout=LAYOUT, host_chunks=16, nvme_chunks=0, tenants=tenants,
                          service={"admin_token": admin, "request_timeout_s": 0.3, "max_abandoned_calls": cap})
    text = config.read_text().replace("put_timeout_s = 3.0", "put_timeout_s = 0.5")
    config.write_text(text + f'[[tiers]]\nkind = "redis"\ncapacity = "{64 * LAYOUT.chunk_bytes}B"\n'
                             f'options = {{ url = "redis://127.0.0.1:{port}/0", socket_timeout_s = 60.0, '
                             f'prefix = "{prefix}" }}\n')
    daemon = Daemon(config, root / "daemon.log").start()
    try:
        yield proc, daemon
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        daemon.close()
        proc.kill()
        proc.wait()
