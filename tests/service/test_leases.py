"""Shared-memory grants: a client that dies holding a lease or a reservation does not leak the slot,
and a leased slot is not reused while the lease lives."""

from __future__ import annotations

import httpx

from connector.client import KVStoreClient
from service.errors import NotFoundError
from service.leases import GrantKind, GrantTable
from service.process import Daemon
from tests.conftest import make_chunk
from tests.helpers.forkserver import ForkServer
from tests.helpers.waits import wait_until
from tests.service.conftest import LAYOUT


def _host_used_bytes(url: str) -> int:
    return int(httpx.get(f"{url}/v1/stats").json()["tiers"]["host"]["used_bytes"])


def test_dead_client_does_not_leak_slots(daemon: Daemon, fork_server: ForkServer) -> None:
    slot = LAYOUT.chunk_bytes
    with KVStoreClient(daemon.url, use_shm=True) as client:
        leased, reserved = client.chunk_keys(list(range(900_000, 900_000 + 2 * LAYOUT.chunk_tokens)))
        assert client.put(leased, make_chunk(LAYOUT, 1)).ok
    child = fork_server.run(["-m", "tests.programs.die_holding_grants", daemon.url, leased.hex(), reserved.hex()],
                            timeout_s=60)
    assert child.returncode == -9, child.stderr
    held = _host_used_bytes(daemon.url)  # includes the leased slot and the reserved one (lease_s = 3 s)
    expired_before = daemon.metric("kvstore_shm_grants_expired_total")
    assert expired_before == 0 or held  # (measured before the reaper ran, or the test is void)
    # Removing the leased chunk cannot free its slot while the (dead) reader's lease lives.
    assert httpx.delete(f"{daemon.url}/v1/chunks/{leased.hex()}").json() == {"removed": True}
    assert _host_used_bytes(daemon.url) == held or daemon.metric("kvstore_shm_grants_expired_total") > expired_before
    assert wait_until(lambda: daemon.metric('kvstore_shm_grants{kind="lease"}') == 0
                     and daemon.metric('kvstore_shm_grants{kind="reservation"}') == 0)
    assert daemon.metric("kvstore_shm_grants_expired_total") >= expired_before + 1
    assert _host_used_bytes(daemon.url) == held - 2 * slot  # both slots came back
    reply = httpx.post(f"{daemon.url}/v1/shm/release", json={"ids": ["0" * 24]})
    assert reply.status_code == 404 and "expired" in reply.json()["detail"]


def test_grant_table_expiry_with_a_fake_clock():
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
