"""Quotas and ledgers on a real daemon, each tenant a separate client process: ledgers that follow
evictions through both data paths (shared-memory segments and HTTP) and survive a restart."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from connector.client import KVStoreClient
from tests.service.conftest import LAYOUT, TOKENS, start_daemon

ADMIN = "admin-token-0123456789"
CHUNK = LAYOUT.chunk_bytes
TENANTS = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
           {"name": "b", "token": TOKENS["b"], "salt": "salt-b", "shm": True},
           {"name": "q", "token": TOKENS["q"], "salt": "salt-q", "shm": True,
            "quota": {"host": 4 * CHUNK, "nvme": 64 * CHUNK}}]

# A tenant's client in its own process: put `n` chunks of prompt `seed` (over shm or HTTP), print stored count.
PUT = """
import sys, torch
from connector.client import KVStoreClient
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT
url, token, seed, n, shm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
with KVStoreClient(url, token=token, use_shm=shm) as c:
    keys = c.chunk_keys(list(range(seed * 100_000, seed * 100_000 + n * LAYOUT.chunk_tokens)))
    print(len(c.put_many(keys, [make_chunk(LAYOUT, seed + i) for i in range(n)]).stored))
"""

def _run(script: str, *args: object) -> str:
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _stats(d, token: str) -> dict:
    return httpx.get(f"{d.url}/v1/stats", headers={"Authorization": f"Bearer {token}"}).json()


@pytest.fixture
def daemon3(tmp_path):
    d = start_daemon(tmp_path, host_chunks=16, nvme_chunks=24, tenants=TENANTS,
                     service={"admin_token": ADMIN})
    yield d
    d.close()


def test_ledgers_follow_evictions_through_both_planes(daemon3):
    for seed in range(1, 7):  # 6 x 10 chunks through a 16 + 24 chunk store: continual eviction
        _run(PUT, daemon3.url, TOKENS["a" if seed % 2 else "b"], seed, 10, seed % 3 == 0)
    admin = _stats(daemon3, ADMIN)
    ledgers = sum(t["chunks"] for t in admin["tenants"].values())
    assert ledgers == admin["chunks"] <= 40  # every indexed chunk charged once, nothing evicted still charged
    assert admin["tiers"]["host"]["evictions"] > 0 and admin["tiers"]["nvme"]["evictions"] > 0
    for name in ("a", "b"):
        assert admin["tenants"][name]["used_bytes"] == admin["tenants"][name]["chunks"] * CHUNK


def test_ledger_survives_a_restart(tmp_path):
    d = start_daemon(tmp_path, host_chunks=16, nvme_chunks=64, tenants=TENANTS, service={"admin_token": ADMIN})
    try:
        assert _run(PUT, d.url, TOKENS["q"], 3, 3, 0) == "3"
        assert _run(PUT, d.url, TOKENS["b"], 4, 2, 0) == "2"
        assert d.stop() == 0
        d.start()
        assert _stats(d, TOKENS["q"])["tenant"]["used_bytes"] == 3 * CHUNK
        assert _stats(d, TOKENS["b"])["tenant"]["used_bytes"] == 2 * CHUNK
        assert _run(PUT, d.url, TOKENS["q"], 5, 3, 0) == "3"  # 6 > quota of 4: q drops its own oldest
        assert _stats(d, TOKENS["q"])["tenant"]["used_bytes"] == 4 * CHUNK
        with KVStoreClient(d.url, token=TOKENS["b"]) as b:
            assert b.lookup(list(range(4 * 100_000, 4 * 100_000 + 2 * LAYOUT.chunk_tokens))) == 2 * LAYOUT.chunk_tokens
    finally:
        d.close()
