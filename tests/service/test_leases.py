"""Shared-memory grants: a client that dies holding a lease or a reservation does not leak the slot,
and a leased slot is not reused while the lease lives."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import httpx

from connector.client import KVStoreClient
from service.errors import NotFoundError
from service.leases import GrantKind, GrantTable
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT

DIE_HOLDING_GRANTS = """
import os, sys, httpx
url, leased, reserved = sys.argv[1:]
assert httpx.post(url + "/v1/shm/acquire", json={"keys": [leased]}).json()["leases"][0] is not None
assert len(httpx.post(url + "/v1/shm/reserve", json={"keys": [reserved]}).json()["grants"]) == 1
os.kill(os.getpid(), 9)
"""


def _host_used_bytes(url: str) -> int:
    return int(httpx.get(f"{url}/v1/stats").json()["tiers"]["host"]["used_bytes"])


def _wait_for(predicate: Any, timeout_s: float = 30.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_dead_client_does_not_leak_slots(daemon: Any) -> None:
    slot = LAYOUT.chunk_bytes
    with KVStoreClient(daemon.url, use_shm=True) as client:
        leased, reserved = client.chunk_keys(list(range(900_000, 900_000 + 2 * LAYOUT.chunk_tokens)))
        assert client.put(leased, make_chunk(LAYOUT, 1)).ok
    child = subprocess.run([sys.executable, "-c", DIE_HOLDING_GRANTS, daemon.url, leased.hex(), reserved.hex()],
                           capture_output=True, timeout=60)
    assert child.returncode == -9, child.stderr.decode()
    held = _host_used_bytes(daemon.url)  # includes the leased slot and the reserved one (lease_s = 3 s)
    expired_before = daemon.metric("kvstore_shm_grants_expired_total")
    assert expired_before == 0 or held  # (measured before the reaper ran, or the test is void)
    # Removing the leased chunk cannot free its slot while the (dead) reader's lease lives.
    assert httpx.delete(f"{daemon.url}/v1/chunks/{leased.hex()}").json() == {"removed": True}
    assert _host_used_bytes(daemon.url) == held or daemon.metric("kvstore_shm_grants_expired_total") > expired_before
    assert _wait_for(lambda: daemon.metric('kvstore_shm_grants{kind="lease"}') == 0
                     and daemon.metric('kvstore_shm_grants{kind="reservation"}') == 0)
    assert daemon.metric("kvstore_shm_grants_expired_total") >= expired_before + 1
    assert _host_used_bytes(daemon.url) == held - 2 * slot  # both slots came back
    reply = httpx.post(f"{daemon.url}/v1/shm/release", json={"ids": ["0" * 24]})
    assert reply.status_code == 404 and "expired" in reply.json()["detail"]


def test_grant_table_expiry_with_a_fake_clock() -> None:
    now = [100.0]
    table = GrantTable(lease_s=10.0, clock=lambda: now[0])
    lease_id = table.add(GrantKind.LEASE, "a", "lease-handle")
    table.add(GrantKind.RESERVATION, "a", "res-handle")
    now[0] = 109.0
    assert table.expired() == []
    try:
        table.take(lease_id, GrantKind.LEASE, "b")  # another tenant cannot release it
        raise AssertionError("foreign take must fail")
    except NotFoundError:
        pass
    assert table.take(lease_id, GrantKind.LEASE, "a") == "lease-handle"
    now[0] = 110.0
    assert [g.handle for g in table.expired()] == ["res-handle"]
    assert table.count(GrantKind.RESERVATION) == 0 and table.num_expired == 1
