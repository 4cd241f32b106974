"""A real daemon reports its memory by component (host tier, index and per-chunk state, buffers and segments,
the rest of its RSS) in /v1/stats, /metrics and `kvstore stats --url`; the per-chunk state follows the chunks
held, counted by kvstore/store/memory_model.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from connector.client import KVStoreClient
from kvstore.store.memory_model import INDEX_ENTRY_BYTES, KEY_BYTES, LEDGER_ENTRY_BYTES, tier_chunk_bytes
from service.exposition import parse_samples, sample
from service.memory_report import COMPONENTS
from service.process import CLI, Daemon
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, TOKENS, start_daemon

ADMIN = "admin-token-memory-0123456789"
HOST_CHUNKS = 16


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("memory-report")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
               {"name": "b", "token": TOKENS["b"], "salt": "salt-b", "shm": False}]
    d = start_daemon(root, host_chunks=HOST_CHUNKS, nvme_chunks=256, tenants=tenants, service={"admin_token": ADMIN})
    yield d
    d.close()


def admin_stats(url: str) -> dict[str, Any]:
    reply = httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def modelled_state(stats: dict[str, Any]) -> int:
    """Per-chunk state as the model counts it, from the counts /v1/stats gives."""
    per_tier = {"host": tier_chunk_bytes(is_memory=True, eviction="adaptive"),
                "nvme": tier_chunk_bytes(is_memory=False, eviction="adaptive")}
    ledgers = sum(t["chunks"] for t in stats["tenants"].values())
    return (stats["chunks"] * (KEY_BYTES + INDEX_ENTRY_BYTES) + ledgers * LEDGER_ENTRY_BYTES
            + sum(stats["tiers"][name]["chunks"] * per_tier[name] for name in per_tier))


def put_prompt(url: str, token: str, first_token: int, num_chunks: int) -> None:
    with KVStoreClient(url, token=token, use_shm=False) as client:
        keys = client.chunk_keys(list(range(first_token, first_token + num_chunks * LAYOUT.chunk_tokens)))
        result = client.put_many(keys, [make_chunk(LAYOUT, i) for i in range(num_chunks)])
        assert result.ok, result.not_stored


def test_stats_give_every_component_and_they_add_up_to_the_rss(daemon: Daemon) -> None:
    memory = admin_stats(daemon.url)["memory"]
    assert set(memory) == {"rss_bytes", *(f"{c}_bytes" for c in COMPONENTS)}
    assert memory["rss_bytes"] > 0
    assert sum(memory[f"{c}_bytes"] for c in COMPONENTS) == memory["rss_bytes"]  # the rest is what is left
    assert memory["host_tier_bytes"] == admin_stats(daemon.url)["tiers"]["host"]["capacity_bytes"]


def test_chunk_state_follows_the_chunks_held(daemon: Daemon) -> None:
    before = admin_stats(daemon.url)
    put_prompt(daemon.url, TOKENS["b"], 10_000, 40)
    after = admin_stats(daemon.url)
    assert after["chunks"] >= before["chunks"] + 40
    for stats in (before, after):
        assert stats["memory"]["index_and_chunk_state_bytes"] == modelled_state(stats)
    grown = after["memory"]["index_and_chunk_state_bytes"] - before["memory"]["index_and_chunk_state_bytes"]
    per_disk_chunk = KEY_BYTES + INDEX_ENTRY_BYTES + LEDGER_ENTRY_BYTES + tier_chunk_bytes(is_memory=False,
                                                                                           eviction="adaptive")
    assert grown >= 40 * per_disk_chunk


def test_metrics_give_a_gauge_per_component(daemon: Daemon) -> None:
    text = httpx.get(f"{daemon.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).text
    found = {dict(labels)["component"]: int(value) for (name, labels), value in parse_samples(text).items()
             if name == "kvstore_memory_bytes"}
    assert set(found) == set(COMPONENTS)
    rss = int(sample(text, "kvstore_memory_rss_bytes"))
    assert sum(found.values()) == rss and found["host_tier"] == HOST_CHUNKS * LAYOUT.chunk_bytes
    assert "# TYPE kvstore_memory_bytes gauge" in text


def test_kvstore_stats_url_prints_the_memory(daemon: Daemon) -> None:
    done = subprocess.run([sys.executable, *CLI, "stats", "--url", daemon.url, "--token", ADMIN],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    memory = json.loads(done.stdout)["memory"]
    assert set(memory) == {"rss_bytes", *(f"{c}_bytes" for c in COMPONENTS)}
    assert memory["rss_bytes"] > memory["host_tier_bytes"] == HOST_CHUNKS * LAYOUT.chunk_bytes
