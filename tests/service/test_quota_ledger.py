"""Quotas and ledgers on a real daemon, each tenant a separate client process: quota charged at
reservation, ledgers that follow evictions and survive a restart, read leases that cannot pin the
host tier, and commit/abort/release with a mix of valid and bogus ids."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

# Re-acquire leases on every chunk the tenant can see, as fast as it can, for `seconds`.
HOG = """
import sys, time, httpx
url, token, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
auth = {"Authorization": "Bearer " + token}
keys = httpx.post(url + "/v1/lookup", json={"token_ids": list(range(int(sys.argv[4])))}, headers=auth).json()["keys"]
end = time.monotonic() + seconds
while time.monotonic() < end:
    httpx.post(url + "/v1/shm/acquire", json={"keys": keys}, headers=auth)
"""


def _run(script: str, *args: object) -> str:
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _stats(d: Any, token: str) -> dict:
    return httpx.get(f"{d.url}/v1/stats", headers={"Authorization": f"Bearer {token}"}).json()


@pytest.fixture
def daemon3(tmp_path: Path) -> Iterator[Any]:
    d = start_daemon(tmp_path, host_chunks=16, nvme_chunks=24, tenants=TENANTS,
                     service={"admin_token": ADMIN, "lease_s": 30.0, "shm_plane": "arena"})
    yield d
    d.close()


def test_quota_is_charged_at_reservation(daemon3: Any) -> None:
    assert _run(PUT, daemon3.url, TOKENS["b"], 7, 4, 1) == "4"
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
        assert b.lookup(list(range(7 * 100_000, 7 * 100_000 + 4 * LAYOUT.chunk_tokens))) == 4 * LAYOUT.chunk_tokens
    assert _stats(daemon3, TOKENS["q"])["tenant"]["used_bytes"] == 4 * CHUNK


def test_ledgers_follow_evictions_through_both_planes(daemon3: Any) -> None:
    for seed in range(1, 7):  # 6 x 10 chunks through a 16 + 24 chunk store: continual eviction
        _run(PUT, daemon3.url, TOKENS["a" if seed % 2 else "b"], seed, 10, seed % 3 == 0)
    admin = _stats(daemon3, ADMIN)
    ledgers = sum(t["chunks"] for t in admin["tenants"].values())
    assert ledgers == admin["chunks"] <= 40  # every indexed chunk charged once, nothing evicted still charged
    assert admin["tiers"]["host"]["evictions"] > 0 and admin["tiers"]["nvme"]["evictions"] > 0
    for name in ("a", "b"):
        assert admin["tenants"][name]["used_bytes"] == admin["tenants"][name]["chunks"] * CHUNK


def test_ledger_survives_a_restart(tmp_path: Path) -> None:
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


def test_a_lease_hog_cannot_block_puts(daemon3: Any) -> None:
    assert _run(PUT, daemon3.url, TOKENS["a"], 9, 12, 0) == "12"
    hog = subprocess.Popen([sys.executable, "-c", HOG, daemon3.url, TOKENS["a"], "12",
                            str(900_000 + 12 * LAYOUT.chunk_tokens)])
    try:
        time.sleep(2.0)
        assert int(_run(PUT, daemon3.url, TOKENS["b"], 11, 5, 0)) == 5
        assert int(_run(PUT, daemon3.url, TOKENS["b"], 12, 5, 1)) == 5
    finally:
        hog.kill()
        hog.wait()


def test_mixed_valid_and_bogus_ids_still_process_the_valid_ones(daemon3: Any) -> None:
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


# Re-acquire leases on n chunks for `seconds` (a new lease before releasing the old: always pinned);
# print each answer in order: its status, or "pin" for a refusal naming the renewal bound.
RENEWER = """
import sys, time, httpx
url, token, seconds, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
auth = {"Authorization": "Bearer " + token}
keys = httpx.post(url + "/v1/lookup", json={"token_ids": list(range(n * int(sys.argv[5])))}, headers=auth).json()["keys"]
end, codes, held = time.monotonic() + seconds, [], []
while time.monotonic() < end:
    got = httpx.post(url + "/v1/shm/acquire", json={"keys": keys}, headers=auth)
    codes.append("pin" if "max_pin_s" in got.text else str(got.status_code))
    if held:
        httpx.post(url + "/v1/shm/release", json={"ids": held}, headers=auth)
    held = [lease["id"] for lease in got.json()["leases"] if lease] if got.status_code == 200 else []
    time.sleep(0.05)
print(" ".join(map(str, codes)))
"""


def test_renewals_are_bounded_and_other_tenants_then_evict(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, host_chunks=16, nvme_chunks=0, tenants=TENANTS,
                     service={"admin_token": ADMIN, "shm_plane": "arena", "lease_s": 1.0, "max_pin_s": 2.0,
                              "pin_window_s": 120.0})
    try:
        assert _run(PUT, d.url, TOKENS["a"], 0, 3, 1) == "3"
        hog = subprocess.Popen([sys.executable, "-c", RENEWER, d.url, TOKENS["a"], "9", "3", str(LAYOUT.chunk_tokens)],
                               stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(5.0)  # past max_pin_s + lease_s (+ a reaper round): the hog's leases are gone
            assert int(_run(PUT, d.url, TOKENS["b"], 20, 16, 0)) == 16  # all of the host tier
            with KVStoreClient(d.url, token=TOKENS["a"], use_shm=False) as a:
                assert a.lookup(list(range(3 * LAYOUT.chunk_tokens))) < 3 * LAYOUT.chunk_tokens  # evicted
        finally:
            out, _ = hog.communicate(timeout=60)
        codes = out.split()
        assert codes[0] == "200" and "pin" in codes
        assert set(codes[:codes.index("pin")]) == {"200"}  # within the bound, every renewal granted
        assert set(codes[codes.index("pin"):]) == {"pin"}  # past it, refused for the rest of the window
    finally:
        d.close()
