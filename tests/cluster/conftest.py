"""Real redis-server processes for the cluster tests: one per session, plus killable ones per test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

REDIS_BINARY = shutil.which("redis-server")
MISSING = "redis-server is not installed (apt-get install redis-server; scripts/test.sh does it in CI)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
