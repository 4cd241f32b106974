"""Issue 27, item 3: the daemon memory a tenant causes is charged to it. Its segments and request
buffers are refused with 429 past its memory budget, the segments of a client killed with SIGKILL
are reclaimed within 5 s (the daemon watches the process that received them), and the descriptor
socket of a daemon killed with SIGKILL is removed when the next one starts."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from connector.client import KVStoreClient
from service.process import Daemon
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, TOKENS, start_daemon

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "memory-admin-token-0123456"
SEGMENT_BYTES = 4 * LAYOUT.chunk_bytes  # a 4-slot segment
BUDGET = 3 * SEGMENT_BYTES


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Tenant m: a budget of three 4-slot segments and a quota of 2 chunks; tenant a: the defaults."""
    tenants = [{"name": "m", "token": TOKENS["q"], "salt": "salt-m", "shm": True, "memory": BUDGET,
                "quota": {"host": 2 * LAYOUT.chunk_bytes}},
               {"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True}]
    d = start_daemon(tmp_path_factory.mktemp("memory"), host_chunks=32, tenants=tenants,
                     service={"admin_token": ADMIN, "max_batch_chunks": 64})
    yield d
    d.close()


def _tenant(daemon: Daemon, name: str) -> dict[str, Any]:
    stats = httpx.get(f"{daemon.url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
    return stats["tenants"][name]  # type: ignore[no-any-return]


def test_a_tenant_is_refused_past_its_memory_budget(budgeted: Daemon) -> None:
    with budgeted.client(TOKENS["q"]) as http:
        made = [http.post("/v1/shm/segments", json={"slots": 4}) for _ in range(4)]
        assert [r.status_code for r in made] == [200, 200, 200, 429]
        refused = made[-1].json()
        assert refused["error"] == "MemoryBudgetError"
        assert "memory budget" in refused["detail"] and "service.tenant_memory_bytes" in refused["detail"]
        assert _tenant(budgeted, "m")["memory_bytes"] == BUDGET == _tenant(budgeted, "m")["memory_limit_bytes"]
        with budgeted.client(TOKENS["a"]) as other:  # another tenant is not charged for m's segments
            assert other.post("/v1/shm/segments", json={"slots": 4}).status_code == 200
        for reply in made[:3]:
            assert http.post("/v1/shm/segments/close", json={"segment": reply.json()["id"]}).status_code == 200
    assert _tenant(budgeted, "m")["memory_bytes"] == 0


def test_http_staging_counts_and_the_client_names_the_refusal(budgeted: Daemon) -> None:
    """A put whose body passes the budget is refused (429): the client reports it in not_stored."""
    with KVStoreClient(budgeted.url, token=TOKENS["q"], use_shm=False) as m:
        keys = m.chunk_keys(list(range(16 * LAYOUT.chunk_tokens)))
        chunks = [make_chunk(LAYOUT, i) for i in range(16)]
        result = m.put_many(keys, chunks)  # 16 chunks = 4 segments' bytes in one body
        assert not result.stored and set(result.not_stored) == set(keys)
        assert "memory budget" in next(iter(result.not_stored.values()))
        assert m.put_many(keys[:2], chunks[:2]).ok  # within the budget (and the quota of 2 chunks)
        outs = [torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype) for _ in range(16)]
        assert m.get_many(keys, outs) == [False] * 16  # the get's response buffer passes it too: misses
        assert m.get_many(keys[:2], outs[:2]) == [True, True]
    assert _tenant(budgeted, "m")["memory_bytes"] == 0  # staging is released with the call


def test_segments_of_a_killed_client_are_reclaimed_within_5_s(budgeted: Daemon) -> None:
    holder = subprocess.Popen([sys.executable, "-m", "tests.service.shm_client_holder", budgeted.url, TOKENS["a"]],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("ready")
        held = _tenant(budgeted, "a")
        assert held["segments"] >= 2 and held["memory_bytes"] > 0  # its staging segment and its pool
    finally:
        holder.kill()
        holder.wait()
    killed = time.monotonic()
    while _tenant(budgeted, "a")["segments"] > held["segments"] - 2 and time.monotonic() - killed < 30:
        time.sleep(0.1)
    took = time.monotonic() - killed
    assert _tenant(budgeted, "a")["segments"] == held["segments"] - 2
    assert took < 5.0, f"reclaimed {took:.1f} s after the kill"


def test_no_socket_is_left_after_a_kill_and_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also the client's contract against a daemon that died: misses and not_stored, no exception."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True}]
    (tmp_path / "one").mkdir()
    first = start_daemon(tmp_path / "one", host_chunks=16, tenants=tenants)
    with KVStoreClient(first.url, token=TOKENS["a"], use_shm=True) as a:
        keys = a.chunk_keys(list(range(LAYOUT.chunk_tokens)))
        assert a.put_many(keys, [make_chunk(LAYOUT, 1)]).ok
        sockets = list((tmp_path / "tmp").glob("kvstore-*.fds"))
        assert len(sockets) == 1
        first.kill()
        assert sockets[0].exists()  # SIGKILL: nobody removed it
        out = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
        assert a.get_many(keys, [out]) == [False]
        result = a.put_many(keys, [make_chunk(LAYOUT, 1)])
        assert not result.stored and "not stored" in result.not_stored[keys[0]]
    (tmp_path / "two").mkdir()
    second = start_daemon(tmp_path / "two", host_chunks=16, tenants=tenants)
    try:
        with KVStoreClient(second.url, token=TOKENS["a"], use_shm=True):
            left = list((tmp_path / "tmp").glob("kvstore-*.fds"))
        assert not sockets[0].exists() and len(left) == 1, left
    finally:
        second.close()
