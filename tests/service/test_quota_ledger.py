"""Quotas and ledgers on a real daemon, each tenant a separate client process: ledgers that follow
evictions through both data paths (shared-memory segments and HTTP) and survive a restart.

The client processes are tests/programs/tenant_put, forked by the fork server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.client import KVStoreClient
from service.process import Daemon
from tests.helpers.forkserver import ForkServer
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


@pytest.fixture(scope="module")
def daemon3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("quota"), host_chunks=16, nvme_chunks=24, tenants=TENANTS,
                     service={"admin_token": ADMIN})
    yield d
    d.close()


def test_ledgers_follow_evictions_through_both_planes(daemon3: Daemon, fork_server: ForkServer) -> None:
    for seed in range(1, 7):  # 6 x 10 chunks through a 16 + 24 chunk store: continual eviction
        _put(fork_server, daemon3, "a" if seed % 2 else "b", seed, 10, seed % 3 == 0)
    admin = _stats(daemon3, ADMIN)
    ledgers = sum(t["chunks"] for t in admin["tenants"].values())
    assert ledgers == admin["chunks"] <= 40  # every indexed chunk charged once, nothing evicted still charged
    assert admin["tiers"]["host"]["evictions"] > 0 and admin["tiers"]["nvme"]["evictions"] > 0
    for name in ("a", "b"):
        assert admin["tenants"][name]["used_bytes"] == admin["tenants"][name]["chunks"] * CHUNK


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
