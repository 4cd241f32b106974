"""The PFS eviction lease: one holder at a time across threads and processes; safe renew and release."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from kvstore.cluster.config import ClusterKeys
from kvstore.cluster.lease import RedisLease
from kvstore.cluster.pfs_evict import EvictionPass
from tests.cluster.factories import LAYOUT, chunk_of, join, node_store, prompt
from tests.helpers.forkserver import ForkServer
from tests.helpers.waits import wait_until
from tests.tiers.conftest import REPO_ROOT

pytestmark = pytest.mark.redis
LEASE = ClusterKeys("test").pfs_lease


def test_contending_threads_never_hold_it_together(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    inside, overlaps, holders = [0], [], set()
    lock = threading.Lock()
    start = threading.Barrier(6)  # all contend at once: under load one thread could otherwise finish before the next starts

    def contender(name: str) -> None:
        lease = RedisLease(redis.Redis.from_url(redis_url), LEASE, name, ttl_s=5)
        start.wait(timeout=60)
        # Each contends until it held the lease 3 times: with 40 tries each, one thread on a loaded machine took
        # every turn while the others spent their tries (a CI run: holders == {"node-5"})
        num_held, deadline = 0, time.monotonic() + 60
        while num_held < 3 and time.monotonic() < deadline:
            with lease.hold() as held:
                if not held:
                    continue
                num_held += 1
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
    assert holders == {f"node-{i}" for i in range(6)}  # it really changed hands, to every contender
    assert client.get(LEASE) is None  # every holder released it


def test_contending_processes_never_hold_it_together(redis_url: str, tmp_path: Path, fork_server: ForkServer) -> None:
    marker = str(tmp_path / "inside")
    outs = [tmp_path / f"proc-{i}.out" for i in range(3)]
    procs = [fork_server.spawn(["-m", "tests.programs.lease_contender", redis_url, f"proc-{i}", marker, LEASE],
                               stdout=out, stderr=out.with_suffix(".err"), cwd=REPO_ROOT) for i, out in enumerate(outs)]
    results = []
    for proc, out in zip(procs, outs, strict=True):
        assert proc.wait(60) == 0, out.with_suffix(".err").read_text()
        results.append(tuple(int(x) for x in out.read_text().split()))
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


def _counted(evict: Callable[[int], EvictionPass], passes: list[int], i: int) -> Callable[[int], EvictionPass]:
    def counted(budget_bytes: int) -> EvictionPass:
        try:
            return evict(budget_bytes)
        finally:
            passes[i] += 1

    return counted


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
    passes = [0, 0, 0]
    for i, node in enumerate(nodes):  # count each janitor's passes (it calls node.evict_pfs every interval)
        node.evict_pfs = _counted(node.evict_pfs, passes, i)  # type: ignore[method-assign, assignment]
    assert wait_until(lambda: sum(stores[1].levels[-1].tier.meta(k) is not None for k in keys) <= 15, timeout_s=10)
    after = list(passes)  # five more passes of every janitor: none may evict below the budget
    assert wait_until(lambda: all(now >= then + 5 for now, then in zip(passes, after, strict=True)), timeout_s=10)
    assert sum(stores[2].levels[-1].tier.meta(k) is not None for k in keys) == 15
    assert stores[2].lookup(prompt(20, seed=8)) == 15 * LAYOUT.chunk_tokens  # the tail went, the head stayed
    for node, store in zip(nodes, stores, strict=True):
        node.close()
        store.close()
