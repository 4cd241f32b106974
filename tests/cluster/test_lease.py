"""The PFS eviction lease: one holder at a time across threads and processes; safe renew and release."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from kvstore.cluster.config import ClusterKeys
from kvstore.cluster.lease import RedisLease
from tests.cluster.factories import LAYOUT, chunk_of, join, node_store, prompt
from tests.tiers.conftest import REPO_ROOT

pytestmark = pytest.mark.redis
LEASE = ClusterKeys("test").pfs_lease


def test_contending_threads_never_hold_it_together(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    inside, overlaps, holders = [0], [], set()
    lock = threading.Lock()

    def contender(name: str) -> None:
        lease = RedisLease(redis.Redis.from_url(redis_url), LEASE, name, ttl_s=5)
        for _ in range(40):
            with lease.hold() as held:
                if not held:
                    continue
                with lock:
                    inside[0] += 1
                    holders.add(name)
                    if inside[0] > 1:
                        overlaps.append(name)
                time.sleep(0.001)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=contender, args=(f"node-{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert len(holders) > 1  # it really changed hands
    assert client.get(LEASE) is None  # every holder released it


_PROCESS = """
import os, sys, time, redis
from kvstore.cluster.lease import RedisLease
url, name, marker, key = sys.argv[1:5]
lease = RedisLease(redis.Redis.from_url(url), key, name, ttl_s=5)
held_times = violations = 0
for _ in range(60):
    with lease.hold() as held:
        if not held:
            time.sleep(0.001)
            continue
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # exists = someone else is inside
        except FileExistsError:
            violations += 1
            continue
        held_times += 1
        time.sleep(0.002)
        os.close(fd)
        os.unlink(marker)
print(held_times, violations)
"""


def test_contending_processes_never_hold_it_together(redis_url: str, tmp_path: Path) -> None:
    marker = str(tmp_path / "inside")
    procs = [subprocess.Popen([sys.executable, "-c", _PROCESS, redis_url, f"proc-{i}", marker, LEASE],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT) for i in range(3)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(tuple(int(x) for x in out.split()))
    assert all(violations == 0 for _, violations in results)
    assert sum(held for held, _ in results) > 0


def test_an_expired_owner_cannot_renew_or_release_the_next_ones_lease(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    first = RedisLease(client, LEASE, "slow-node", ttl_s=0.2)
    second = RedisLease(client, LEASE, "next-node", ttl_s=5)
    assert first.try_acquire() and not second.try_acquire()
    deadline = time.monotonic() + 5
    while not second.try_acquire():  # the first owner stalled past its TTL
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert first.renew() is False and first.lost.is_set()
    assert first.release() is False
    assert second.holder() == second.token
    assert second.renew() and second.release() and second.holder() is None


def test_two_nodes_evicting_the_shared_pfs_at_once_evict_it_once(tmp_path: Path, redis_url: str) -> None:
    shared = tmp_path / "pfs"
    stores = [node_store(tmp_path, name, shared_pfs=shared) for name in ("a", "b")]
    nodes = [join(store, redis_url, f"node-{name}") for store, name in zip(stores, "ab", strict=True)]
    keys = stores[0].chunk_keys(prompt(20, seed=7))
    stores[0].put_many(keys, [chunk_of(i) for i in range(20)])
    stores[0].flush()
    file_bytes = stores[0].levels[-1].tier.footprint(LAYOUT.chunk_bytes)
    budget = 12 * file_bytes
    barrier = threading.Barrier(2)
    passes = [None, None]

    def run(i: int) -> None:
        barrier.wait()
        passes[i] = nodes[i].evict_pfs(budget)  # type: ignore[call-overload]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(p.num_removed for p in passes) == 8  # type: ignore[attr-defined]  # exactly what was over budget, never twice that
    remaining = [k for k in keys if stores[1].levels[-1].tier.meta(k) is not None]
    assert len(remaining) == 12 and any(p.led for p in passes)  # type: ignore[attr-defined]
    for node, store in zip(nodes, stores, strict=True):
        node.close()
        store.close()


def test_janitors_on_every_node_bring_the_shared_pfs_under_budget(tmp_path: Path, redis_url: str) -> None:
    """Each node runs a janitor; whoever holds the lease evicts; the directory ends at the budget, not below."""
    shared = tmp_path / "pfs"
    stores = [node_store(tmp_path, name, shared_pfs=shared) for name in ("a", "b", "c")]
    file_bytes = stores[0].levels[-1].tier.footprint(LAYOUT.chunk_bytes)
    keys = stores[0].chunk_keys(prompt(20, seed=8))
    stores[0].put_many(keys, [chunk_of(i) for i in range(20)])
    stores[0].flush()
    for i, key in enumerate(keys):  # written in prefix order inside one mtime bucket, whatever the clock says
        os.utime(stores[0].levels[-1].tier.chunk_path(key), (1_000_000_000, 1_000_000_000 + i / 1000))  # type: ignore[attr-defined]
    nodes = [join(store, redis_url, f"node-{name}", pfs_budget_bytes=15 * file_bytes, pfs_evict_interval_s=0.02)
             for store, name in zip(stores, "abc", strict=True)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(stores[1].levels[-1].tier.meta(k) is not None for k in keys) > 15:
        time.sleep(0.05)
    time.sleep(0.2)  # more janitor passes: none may evict below the budget
    assert sum(stores[2].levels[-1].tier.meta(k) is not None for k in keys) == 15
    assert stores[2].lookup(prompt(20, seed=8)) == 15 * LAYOUT.chunk_tokens  # the tail went, the head stayed
    for node, store in zip(nodes, stores, strict=True):
        node.close()
        store.close()
