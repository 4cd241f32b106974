"""Store calls that outlive their deadline, against a real redis-server paused with SIGSTOP.

A route answers 503 when its store call's deadline passes, but the call keeps running on its
thread until Redis answers (service/abandoned.py). These tests show that such calls are counted
and capped (at service.max_abandoned_calls new calls fail fast with 503, lookups still answer from
the local index, the admin's stats show the count), that they finish once Redis resumes, and that a
put the client saw fail can still commit afterwards, with the bytes the client sent: the client
retires the shared-memory slots of a failed call, so nothing else is ever written into them.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import torch

from connector.client import KVStoreClient
from service.process import Daemon, write_config
from tests.cluster.conftest import MISSING, REDIS_BINARY, free_port
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, TOKENS

pytestmark = pytest.mark.redis
ADMIN = "admin-token-0123456789"
CAP = 3


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], Daemon]]:
    """A redis-server (no persistence) and a daemon with a Redis tier whose socket timeout (60 s)
    outlasts every deadline: while Redis is paused, a call that reaches it waits until SIGCONT."""
    if REDIS_BINARY is None:
        pytest.skip(MISSING)
    root = tmp_path_factory.mktemp("abandoned")
    port = free_port()
    proc = subprocess.Popen([REDIS_BINARY, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_redis(port)
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True,
                "quota": {"host": 2 * LAYOUT.chunk_bytes}}]
    config = write_config(root, layout=LAYOUT, host_chunks=16, nvme_chunks=0, tenants=tenants,
                          service={"admin_token": ADMIN, "request_timeout_s": 0.3, "max_abandoned_calls": CAP})
    text = config.read_text().replace("put_timeout_s = 3.0", "put_timeout_s = 0.5")
    config.write_text(text + f'[[tiers]]\nkind = "redis"\ncapacity = "{64 * LAYOUT.chunk_bytes}B"\n'
                             f'options = {{ url = "redis://127.0.0.1:{port}/0", socket_timeout_s = 60.0, prefix = "ab" }}\n')
    daemon = Daemon(config, root / "daemon.log").start()
    yield proc, daemon
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
    daemon.close()
    proc.kill()
    proc.wait()


def _wait_for_redis(port: int) -> None:
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    for _ in range(500):
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.02)


def _service_stats(daemon: Daemon) -> dict[str, Any]:
    stats = httpx.get(f"{daemon.url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
    return stats["service"]  # type: ignore[no-any-return]


def _resume_and_drain(proc: subprocess.Popen[bytes], daemon: Daemon) -> None:
    os.kill(proc.pid, signal.SIGCONT)
    end = time.monotonic() + 60
    while _service_stats(daemon)["abandoned_calls"] and time.monotonic() < end:
        time.sleep(0.1)
    assert _service_stats(daemon)["abandoned_calls"] == 0


def test_abandoned_calls_are_capped_and_counted(stalled: tuple[subprocess.Popen[bytes], Daemon]) -> None:
    proc, daemon = stalled
    keys = [f"{i:02x}" * 16 for i in range(CAP + 2)]
    with daemon.client(TOKENS["a"]) as http:
        for key in ("ee" * 16, "ff" * 16):  # fill the quota of 2 chunks
            assert http.put(f"/v1/chunks/{key}", content=make_chunk(LAYOUT, 0).numpy().tobytes()).status_code == 200
        assert http.delete(f"/v1/chunks/{keys[0]}").status_code == 200  # Redis answers: no call abandoned
        before = _service_stats(daemon)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            for key in keys[1:CAP]:  # each delete waits on Redis past request_timeout_s
                reply = http.delete(f"/v1/chunks/{key}")
                assert reply.status_code == 503 and reply.json()["error"] == "BackendTimeoutError", reply.text
            body = make_chunk(LAYOUT, 1).numpy().tobytes()  # a put whose quota victim's delete waits on Redis
            reply = http.put(f"/v1/chunks/{keys[CAP]}", content=body)
            assert reply.status_code == 503 and reply.json()["error"] == "BackendTimeoutError", reply.text
            refused = http.delete(f"/v1/chunks/{keys[-1]}")
            assert refused.status_code == 503 and refused.json()["error"] == "TooManyAbandonedError", refused.text
            assert "max_abandoned_calls" in refused.json()["detail"]
            assert http.post("/v1/lookup", json={"keys": keys}).status_code == 200  # the local index answers
            assert httpx.get(f"{daemon.url}/healthz", timeout=30).status_code == 200
            during = _service_stats(daemon)
            assert during["abandoned_calls"] == CAP == during["abandoned_limit"]
            assert during["abandoned_total"] - before["abandoned_total"] == CAP
            assert during["refused_abandoned"] > before["refused_abandoned"]
            assert len(body) <= during["abandoned_bytes"] < 2 * len(body)  # the put's body (and two keys)
        finally:
            _resume_and_drain(proc, daemon)
        assert http.delete(f"/v1/chunks/{keys[-1]}").status_code == 200  # the calls returned: open again


def test_a_put_that_timed_out_commits_later_with_the_bytes_sent(stalled: tuple[subprocess.Popen[bytes], Daemon]) -> None:
    proc, daemon = stalled
    with KVStoreClient(daemon.url, token=TOKENS["a"], use_shm=True, timeout_s=30) as a:
        keys = a.chunk_keys(list(range(3 * LAYOUT.chunk_tokens)))
        assert a.put_many(keys[:2], [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)]).stored  # the quota is full
        sent = make_chunk(LAYOUT, 3)
        chunk = a.empty_chunk()
        chunk.copy_(sent)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            # The quota makes room by deleting a's oldest chunk, which waits on Redis: the put's deadline passes.
            failed = a.put_many([keys[2]], [chunk])  # the client's contract: named in not_stored, no exception
            assert not failed.stored and "did not answer" in failed.not_stored[keys[2]]
            assert _service_stats(daemon)["abandoned_calls"] == 1
            del chunk
            gc.collect()  # the failed put's slot is free again: a reused pool would hand it out next
            others = [a.empty_chunk() for _ in range(8)]
            for other in others:
                other.fill_(7)
        finally:
            _resume_and_drain(proc, daemon)
    with KVStoreClient(daemon.url, token=TOKENS["a"], use_shm=False) as reader:
        out = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
        assert reader.get(keys[2], out)  # committed after the client was told 503
        assert torch.equal(out, sent)  # ... with the bytes sent, not what later buffers held
