"""Redis killed and restarted mid-run: callers see no errors and no wrong bytes; the index resyncs."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.types import TierKind
from tests.cluster.conftest import RedisServer
from tests.cluster.factories import chunk_of, empty_chunk, join, node_store, prompt

pytestmark = pytest.mark.redis


def _wait_for(predicate: Any, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class Workload(threading.Thread):
    """Puts and reads prompts in a loop, checking every byte it reads; keeps any exception."""

    def __init__(self, store: Any) -> None:
        super().__init__(daemon=True)
        self.store, self.stop, self.errors, self.wrong, self.reads, self.hits = store, threading.Event(), [], 0, 0, 0  # type: ignore[var-annotated]

    def run(self) -> None:
        seed = 0
        while not self.stop.is_set():
            try:
                self._one(seed)
            except Exception as exc:  # any exception reaching a caller is a failure of the test
                self.errors.append(repr(exc))
            seed += 1

    def _one(self, seed: int) -> None:
        tokens = prompt(3, seed=seed % 40)
        keys = self.store.chunk_keys(tokens)
        chunks = [chunk_of(1000 * (seed % 40) + i) for i in range(3)]
        self.store.put_many(keys, chunks)
        outs = [empty_chunk() for _ in keys]
        for ok, out, chunk in zip(self.store.get_many(keys, outs), outs, chunks, strict=True):
            self.reads += 1
            self.hits += ok
            self.wrong += ok and not torch.equal(out, chunk)
        self.store.lookup(tokens)


def test_redis_killed_and_restarted_mid_run(tmp_path: Path, make_redis_server: Any) -> None:
    server: RedisServer = make_redis_server()
    # host holds 4 chunks: most reads come from NVMe and the Redis tier, which dies under them
    store = node_store(tmp_path, "a", redis_url=server.url, host_chunks=4)
    node = join(store, server.url, "node-a", max_queued_events=64, batch_size=16)
    workload = Workload(store)
    workload.start()
    assert _wait_for(lambda: workload.reads > 50 and node.index.status()["resyncs"] >= 1)  # type: ignore[operator]

    server.kill()
    assert _wait_for(lambda: node.status()["redis"] == "degraded")
    reads_when_down = workload.reads
    assert _wait_for(lambda: workload.reads > reads_when_down + 100)  # still serving, from local tiers
    # the queue stays bounded while the workload goes on: past 64 events the oldest are dropped and counted
    assert _wait_for(lambda: node.status()["dropped_events"] > 0)  # type: ignore[operator]
    status = node.status()
    assert status["state"] == "down" and status["queued_events"] <= 64  # type: ignore[operator]  # bounded queue

    server.start()  # same port, empty: everything Redis held is gone
    assert _wait_for(lambda: node.status()["redis"] == "ok" and node.status()["resyncs"] >= 2)  # type: ignore[operator]
    reads_when_back = workload.reads
    assert _wait_for(lambda: workload.reads > reads_when_back + 50)
    workload.stop.set()
    workload.join()
    store.flush()
    assert node.index.flush()

    assert workload.errors == []
    assert workload.wrong == 0 and workload.hits > 0
    published = node.index.node_chunks("node-a")
    resident = {key: set(tiers) for key, tiers in store.resident_keys()}
    assert {key: set(tiers) for key, tiers in published.items()} == resident
    assert any(TierKind.REDIS in tiers for tiers in resident.values())  # the Redis tier works again
    node.close()
    store.close()


def test_slow_redis_is_reported_degraded_then_ok(tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    import redis

    store = node_store(tmp_path, "s")
    node = join(store, redis_url, "node-s", slow_s=0.1, socket_timeout_s=5.0)
    assert node.index.flush()
    caplog.set_level(logging.INFO, logger="kvstore.cluster.health")
    with redis.Redis.from_url(redis_url) as admin:
        admin.execute_command("CLIENT", "PAUSE", 500, "ALL")  # every client's next command waits 0.5 s
    keys = store.chunk_keys(prompt(2, seed=1))
    store.put_many(keys, [chunk_of(0), chunk_of(1)])  # the store answers at once: nothing waits on Redis
    assert _wait_for(lambda: "is slow" in caplog.text)
    store.put_many(store.chunk_keys(prompt(1, seed=2)), [chunk_of(2)])
    assert _wait_for(lambda: "ok again" in caplog.text and node.status()["redis"] == "ok")
    assert node.status()["failures"] == 0  # slow is not down: nothing was dropped or resynced
    node.close()
    store.close()
