"""A daemon with a password-protected, non-persistent Redis (a Redis tier and the cluster index):
the password never appears in an answer or a log line, the cluster routes need tokens (the event
stream the admin's), Redis copies do not count as durable, and with Redis paused (SIGSTOP) or
killed /healthz, lookups and puts still answer."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from connector.client import KVStoreClient
from service.process import Daemon, write_config
from tests.cluster.conftest import MISSING, REDIS_BINARY, free_port
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, TOKENS

pytestmark = pytest.mark.redis
PASSWORD = "s3cret-redis-pw-42"
ADMIN = "admin-token-0123456789"
TENANTS = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a"}, {"name": "b", "token": TOKENS["b"], "salt": "salt-b"}]


@pytest.fixture
def redis_pw(tmp_path: Path) -> Iterator[Any]:
    if REDIS_BINARY is None:
        pytest.skip(MISSING)
    port = free_port()
    proc = subprocess.Popen([REDIS_BINARY, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=PASSWORD, socket_connect_timeout=0.2)
    for _ in range(500):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    yield proc, f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait()


def _daemon(root: Path, url: str, monkeypatch: pytest.MonkeyPatch, *, nvme_chunks: int) -> Daemon:
    config = write_config(root, layout=LAYOUT, host_chunks=16, nvme_chunks=nvme_chunks, tenants=TENANTS,
                          service={"admin_token": ADMIN})
    with config.open("a") as f:  # a Redis tier after the others, with a short socket timeout
        f.write(f'[[tiers]]\nkind = "redis"\ncapacity = "{64 * LAYOUT.chunk_bytes}B"\n'
                f'options = {{ url = "{url}", socket_timeout_s = 1.0, prefix = "trust" }}\n')
    monkeypatch.setenv("KVSTORE_CLUSTER_URL", url)
    monkeypatch.setenv("KVSTORE_CLUSTER_NODE_ID", "node-t")
    return Daemon(config, root / "daemon.log").start()


def test_password_never_shown_and_cluster_routes_need_tokens(tmp_path: Path, redis_pw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = redis_pw
    d = _daemon(tmp_path, url, monkeypatch, nvme_chunks=64)
    try:
        with httpx.Client(base_url=d.url) as http:
            health = http.get("/healthz")
            assert health.status_code == 200 and PASSWORD not in health.text and "url" not in health.json()["cluster"]
            for path in ("/v1/cluster/nodes", "/v1/cluster/events", "/v1/cluster/health"):
                assert http.get(path).status_code == 401, path
            tenant = {"Authorization": f"Bearer {TOKENS['a']}"}
            admin = {"Authorization": f"Bearer {ADMIN}"}
            assert http.get("/v1/cluster/events", headers=tenant).status_code == 403
            answers = [http.get(p, headers=admin) for p in ("/v1/cluster/nodes", "/v1/cluster/events",
                                                            "/v1/cluster/health", "/v1/stats", "/metrics")]
            answers += [http.get("/v1/cluster/health", headers=tenant), http.get("/v1/info", headers=tenant)]
            assert all(a.status_code == 200 for a in answers), [(a.url.path, a.text[-300:]) for a in answers if a.status_code != 200]
            assert all(PASSWORD not in a.text for a in answers)
        assert d.stop() == 0
    finally:
        d.close()
    assert PASSWORD not in d.log.read_text()


def test_a_redis_without_persistence_is_no_durable_copy(tmp_path: Path, redis_pw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = redis_pw
    d = _daemon(tmp_path, url, monkeypatch, nvme_chunks=0)  # host + Redis only
    try:
        with KVStoreClient(d.url, token=TOKENS["a"], use_shm=False) as a:
            keys = a.chunk_keys(list(range(2 * LAYOUT.chunk_tokens)))
            result = a.put_many(keys, [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)])
            assert result.ok and set(result.not_replicated) == set(keys)
            assert "durable" in next(iter(result.not_replicated.values()))
    finally:
        d.close()


def test_paused_then_killed_redis_stalls_nothing(tmp_path: Path, redis_pw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, url = redis_pw
    d = _daemon(tmp_path, url, monkeypatch, nvme_chunks=64)
    try:
        with KVStoreClient(d.url, token=TOKENS["a"], use_shm=False, timeout_s=30) as a:
            tokens = list(range(4 * LAYOUT.chunk_tokens))
            keys = a.chunk_keys(tokens)
            assert a.put_many(keys[:2], [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)]).ok
            os.kill(proc.pid, signal.SIGSTOP)
            for i in range(3):
                assert httpx.get(f"{d.url}/healthz", timeout=30).status_code == 200
                assert a.lookup(tokens) >= 2 * LAYOUT.chunk_tokens  # the local index answers; misses ask no one inline
                result = a.put_many([keys[2 + i % 2]], [make_chunk(LAYOUT, 10 + i)])
                assert result.ok  # stored locally (NVMe is durable); Redis's copy is what may be missing
            proc.kill()
            os.kill(proc.pid, signal.SIGCONT) if proc.poll() is None else None
            proc.wait()
            assert httpx.get(f"{d.url}/healthz", timeout=30).status_code == 200
            assert a.put_many([keys[3]], [make_chunk(LAYOUT, 20)]).ok
            assert a.lookup(tokens) == 4 * LAYOUT.chunk_tokens
    finally:
        d.close()
