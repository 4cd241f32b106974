"""Quotas and ledgers on a real daemon, each tenant a separate client process: quota charged at
reservation, ledgers that follow evictions and survive a restart, read leases that cannot pin the
host tier, and commit/abort/release with a mix of valid and bogus ids.

The client processes are tests/programs/ (tenant_put, lease_hog, lease_renewer), forked by the
fork server; four tests share one daemon (`daemon3`, module scope) in file order, the lease hog last
because its 30 s leases outlive it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.client import KVStoreClient
from service.process import ChildProcess, Daemon
from tests.helpers.forkserver import ForkServer
from tests.helpers.waits import wait_until
from tests.programs.tenant_put import prompt
from tests.service.conftest import LAYOUT, TOKENS, start_daemon

ADMIN = "admin-token-0123456789"
CHUNK = LAYOUT.chunk_bytes
TENANTS = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
           {"name": "b", "token": TOKENS["b"], "salt": "salt-b", "shm": True},
           {"name": "q", "token": TOKENS["q"], "salt": "salt-q", "shm": True,
            "quota": {"host": 4 * CHUNK, "nvme": 64 * CHUNK}}]


def _put(server: ForkServer, d: Daemon, tenant: str, seed: int, num_chunks: int, shm: bool) -> int:
    """Tenant's client process puts `num_chunks` chunks of prompt `seed`; the number it stored."""
    done = server.run(["-m", "tests.programs.tenant_put", d.url, TOKENS[tenant], str(seed), str(num_chunks),
                       "1" if shm else "0"])
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout)


def _stats(d: Daemon, token: str) -> dict[str, Any]:
    return httpx.get(f"{d.url}/v1/stats", headers={"Authorization": f"Bearer {token}"}).json()


def _leases(d: Daemon, tenant: str) -> int:
    return int(_stats(d, TOKENS[tenant])["grants"]["lease"])


@pytest.fixture(scope="module")
def daemon3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("quota"), host_chunks=16, nvme_chunks=24, tenants=TENANTS,
                     service={"admin_token": ADMIN, "lease_s": 30.0, "shm_plane": "arena"})
    yield d
    d.close()


def test_quota_is_charged_at_reservation(daemon3: Daemon, fork_server: ForkServer) -> None:
    assert _put(fork_server, daemon3, "b", 7, 4, True) == 4
    auth = {"Authorization": f"Bearer {TOKENS['q']}"}
    with KVStoreClient(daemon3.url, token=TOKENS["q"]) as q:
        keys = [k.hex() for k in q.chunk_keys(list(range(16 * LAYOUT.chunk_tokens)))]
    replies = [httpx.post(f"{daemon3.url}/v1/shm/reserve", json={"keys": keys[i:i + 4]}, headers=auth)
               for i in range(0, 16, 4)]  # 4 reservations of 4 chunks against a quota of 4 chunks
    assert [r.status_code for r in replies] == [200, 429, 429, 429]
    assert "reserved" in replies[1].json()["detail"]
    assert _stats(daemon3, TOKENS["q"])["tenant"]["used_bytes"] == 4 * CHUNK  # charged before any commit
    ids = [g["id"] for g in replies[0].json()["grants"]]
    assert httpx.post(f"{daemon3.url}/v1/shm/commit", json={"ids": ids}, headers=auth).status_code == 200
    with KVStoreClient(daemon3.url, token=TOKENS["b"]) as b:  # b lost nothing to q
        assert b.lookup(prompt(7, 4)) == 4 * LAYOUT.chunk_tokens
    assert _stats(daemon3, TOKENS["q"])["tenant"]["used_bytes"] == 4 * CHUNK


def test_ledgers_follow_evictions_through_both_planes(daemon3: Daemon, fork_server: ForkServer) -> None:
    for seed in range(1, 7):  # 6 x 10 chunks through a 16 + 24 chunk store: continual eviction
        _put(fork_server, daemon3, "a" if seed % 2 else "b", seed, 10, seed % 3 == 0)
    admin = _stats(daemon3, ADMIN)
    ledgers = sum(t["chunks"] for t in admin["tenants"].values())
    assert ledgers == admin["chunks"] <= 40  # every indexed chunk charged once, nothing evicted still charged
    assert admin["tiers"]["host"]["evictions"] > 0 and admin["tiers"]["nvme"]["evictions"] > 0
    for name in ("a", "b"):
        assert admin["tenants"][name]["used_bytes"] == admin["tenants"][name]["chunks"] * CHUNK


def test_mixed_valid_and_bogus_ids_still_process_the_valid_ones(daemon3: Daemon) -> None:
    auth = {"Authorization": f"Bearer {TOKENS['a']}"}
    with KVStoreClient(daemon3.url, token=TOKENS["a"]) as a:
        keys = [k.hex() for k in a.chunk_keys(list(range(50_000, 50_000 + 3 * LAYOUT.chunk_tokens)))]
    with httpx.Client(base_url=daemon3.url, headers=auth) as http:
        ids = [g["id"] for g in http.post("/v1/shm/reserve", json={"keys": keys}).json()["grants"]]
        committed = http.post("/v1/shm/commit", json={"ids": [ids[0], "bogus-1"]}).json()
        assert len(committed["stored"]) == 1 and committed["unknown_ids"] == ["bogus-1"]
        aborted = http.post("/v1/shm/abort", json={"ids": ["bogus-2", ids[1], ids[2]]}).json()
        assert aborted == {"aborted": 2, "unknown_ids": ["bogus-2"]}
        assert http.post("/v1/shm/commit", json={"ids": ["bogus-3"]}).status_code == 404
        leases = http.post("/v1/shm/acquire", json={"keys": keys[:1]}).json()["leases"]
        released = http.post("/v1/shm/release", json={"ids": ["bogus-4", leases[0]["id"]]}).json()
        assert released == {"released": 1, "unknown_ids": ["bogus-4"]}
    grants = _stats(daemon3, ADMIN)["all_grants"]
    assert grants == {"lease": 0, "reservation": 0}


def test_a_lease_hog_cannot_block_puts(daemon3: Daemon, fork_server: ForkServer, tmp_path: Path) -> None:
    assert _put(fork_server, daemon3, "a", 9, 12, False) == 12
    hog = fork_server.spawn(["-m", "tests.programs.lease_hog", daemon3.url, TOKENS["a"], "60", "900000",
                             str(12 * LAYOUT.chunk_tokens)], stdout=tmp_path / "hog.log")
    try:  # the hog holds all the leases a tenant may (service.max_lease_fraction of the host tier) before b puts
        assert wait_until(lambda: "refused" in (tmp_path / "hog.log").read_text()), (tmp_path / "hog.log").read_text()
        assert _leases(daemon3, "a") > 0
        assert _put(fork_server, daemon3, "b", 11, 5, False) == 5
        assert _put(fork_server, daemon3, "b", 12, 5, True) == 5
    finally:
        hog.kill()
        hog.wait(30)


def _renewer(server: ForkServer, d: Daemon, out: Path, stop: Path) -> ChildProcess:
    """Tenant a re-acquires leases on its 3 chunks for up to 60 s, until `stop` exists; its answers go to `out`."""
    return server.spawn(["-m", "tests.programs.lease_renewer", d.url, TOKENS["a"], "60", "3", str(LAYOUT.chunk_tokens),
                         str(stop)], stdout=out, stderr=out.with_suffix(".err"))


def test_renewals_are_bounded_and_other_tenants_then_evict(tmp_path: Path, fork_server: ForkServer) -> None:
    d = start_daemon(tmp_path, host_chunks=16, nvme_chunks=0, tenants=TENANTS,
                     service={"admin_token": ADMIN, "shm_plane": "arena", "lease_s": 1.0, "max_pin_s": 2.0,
                              "pin_window_s": 120.0})
    out, stop = tmp_path / "renewer.out", tmp_path / "stop"
    try:
        assert _put(fork_server, d, "a", 0, 3, True) == 3
        hog = _renewer(fork_server, d, out, stop)
        try:
            assert wait_until(lambda: _leases(d, "a") >= 3), out.with_suffix(".err").read_text()
            # Past max_pin_s renewals are refused; the last granted leases then expire (lease_s, a reaper round).
            assert wait_until(lambda: _leases(d, "a") == 0, timeout_s=30.0)
            assert _put(fork_server, d, "b", 20, 16, False) == 16  # all of the host tier
            with KVStoreClient(d.url, token=TOKENS["a"], use_shm=False) as a:
                assert a.lookup(list(range(3 * LAYOUT.chunk_tokens))) < 3 * LAYOUT.chunk_tokens  # evicted
        finally:
            stop.touch()
            assert hog.wait(60) == 0, out.with_suffix(".err").read_text()
        codes = out.read_text().split()
        assert codes[0] == "200" and "pin" in codes
        assert set(codes[:codes.index("pin")]) == {"200"}  # within the bound, every renewal granted
        assert set(codes[codes.index("pin"):]) == {"pin"}  # past it, refused for the rest of the window
    finally:
        d.close()


def test_ledger_survives_a_restart(tmp_path: Path, fork_server: ForkServer) -> None:
    d = start_daemon(tmp_path, host_chunks=16, nvme_chunks=64, tenants=TENANTS, service={"admin_token": ADMIN})
    try:
        assert _put(fork_server, d, "q", 3, 3, False) == 3
        assert _put(fork_server, d, "b", 4, 2, False) == 2
        assert d.stop() == 0
        d.start()
        assert _stats(d, TOKENS["q"])["tenant"]["used_bytes"] == 3 * CHUNK
        assert _stats(d, TOKENS["b"])["tenant"]["used_bytes"] == 2 * CHUNK
        assert _put(fork_server, d, "q", 5, 3, False) == 3  # 6 > quota of 4: q drops its own oldest
        assert _stats(d, TOKENS["q"])["tenant"]["used_bytes"] == 4 * CHUNK
        with KVStoreClient(d.url, token=TOKENS["b"]) as b:
            assert b.lookup(prompt(4, 2)) == 2 * LAYOUT.chunk_tokens
    finally:
        d.close()
