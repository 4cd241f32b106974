"""TieredStore over real host, NVMe and PFS tiers: put/get/lookup, eviction, demotion,
replication, promotion, recovery, corruption, backpressure and bad input."""

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.errors import BadChunkError, LayoutMismatchError
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from tests.conftest import make_chunk, store_config


def _chain(store: Any, n: Any, seed: Any=0) -> Any:
    tokens = torch.arange(seed * 10_000, seed * 10_000 + n * store.layout.chunk_tokens + 5, dtype=torch.int32)
    keys = store.chunk_keys(tokens)
    return tokens, keys, [make_chunk(store.layout, seed * 1000 + i) for i in range(len(keys))]


def _empty(store: Any) -> Any:
    return torch.empty(store.layout.chunk_shape, dtype=store.layout.torch_dtype)


def test_put_get_lookup(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path)) as store:
        tokens, keys, chunks = _chain(store, 4)
        assert store.lookup(tokens) == 0
        assert store.put_many(keys[:3], chunks[:3]).ok
        assert store.lookup(tokens) == 3 * 16  # leading run only; the 5-token tail never counts
        outs = [_empty(store) for _ in keys]
        assert store.get_many(keys, outs) == [True, True, True, False]
        assert all(torch.equal(a, b) for a, b in zip(chunks[:3], outs[:3], strict=False))
        store.remove(keys[1])
        assert store.lookup(tokens) == 16 and not store.contains(keys[1])


def test_get_many_served_names_the_tier_that_served_each_chunk(small_layout: KVLayout, tmp_path: Path) -> None:
    """The daemon's per-tier hit counts come from here: host while the host copy is held, NVMe once it is
    gone (the read promotes it back up), None for a miss; the bytes are the same either way."""
    with TieredStore(store_config(small_layout, tmp_path)) as store:
        _, keys, chunks = _chain(store, 3)
        assert store.put_many(keys[:2], chunks[:2]).ok and store.flush(5.0)
        outs = [_empty(store) for _ in keys]
        assert store.get_many_served(keys, outs) == [TierKind.HOST, TierKind.HOST, None]
        assert store.drop_tier_copies(TierKind.HOST) == 2
        outs = [_empty(store) for _ in keys]
        assert store.get_many_served(keys, outs) == [TierKind.NVME, TierKind.NVME, None]
        assert all(torch.equal(a, b) for a, b in zip(chunks[:2], outs[:2], strict=False))
        assert store.get_many_served(keys[:1], outs[:1]) == [TierKind.HOST]  # promoted by the NVMe read


def test_bad_input_is_named(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path)) as store:
        _, keys, chunks = _chain(store, 1)
        with pytest.raises(LayoutMismatchError, match=r"shape \(2, 2, 8, 2, 32\).*needs \(2, 2, 16, 2, 32\)"):
            store.put(keys[0], chunks[0][:, :, :8])
        with pytest.raises(LayoutMismatchError, match="float32"):
            store.put(keys[0], chunks[0].float())
        with pytest.raises(BadChunkError, match="16 bytes"):
            store.put(b"short", chunks[0])
        assert store.stats()["chunks"] == 0  # nothing half-stored


def test_write_through_survives_host_eviction(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path, host_chunks=3)) as store:
        tokens, keys, chunks = _chain(store, 10)
        assert store.put_many(keys, chunks).ok
        store.flush()
        stats = store.stats()["tiers"]
        assert stats["host"]["chunks"] <= 3 and stats["host"]["used_bytes"] <= stats["host"]["capacity_bytes"]
        assert stats["nvme"]["chunks"] == 10
        outs = [_empty(store) for _ in keys]
        assert all(store.get_many(keys, outs))
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))
        assert store.stats()["tiers"]["nvme"]["hits"] >= 7


def test_write_back_demotes_victims(small_layout: KVLayout, tmp_path: Path) -> None:
    config = store_config(small_layout, tmp_path, host_chunks=2, replicate_to=())
    with TieredStore(config) as store:
        _, keys, chunks = _chain(store, 6)
        assert store.put_many(keys, chunks).ok
        assert store.stats()["tiers"]["host"]["demotions"] == 4  # nothing below until eviction
        outs = [_empty(store) for _ in keys]
        assert all(store.get_many(keys, outs))
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))


def test_promotion_on_read(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path)) as store:
        _, keys, chunks = _chain(store, 3)
        store.put_many(keys, chunks)
        assert store.drop_tier_copies(TierKind.HOST) == 3
        assert store.stats()["tiers"]["host"]["chunks"] == 0
        assert all(store.get_many(keys, [_empty(store) for _ in keys]))
        assert store.stats()["tiers"]["host"]["promotions"] == 3
        assert store.stats()["tiers"]["host"]["chunks"] == 3


def test_replicas_on_every_disk_tier_and_fallback(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path, pfs_chunks=64)) as store:
        _, keys, chunks = _chain(store, 6)
        store.put_many(keys, chunks)
        store.drop_tier_copies(TierKind.HOST)
        assert store.stats()["tiers"]["pfs"]["chunks"] == 6
        # Corrupt the NVMe copy of every chunk: each read falls back to the PFS replica.
        for path in (tmp_path / "nvme").rglob("*.kvc"):
            data = bytearray(path.read_bytes())
            data[5000] ^= 0xFF
            path.write_bytes(bytes(data))
        outs = [_empty(store) for _ in keys]
        assert all(store.get_many(keys, outs))
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))
        stats = store.stats()["tiers"]
        assert stats["pfs"]["hits"] == 6 and stats["nvme"]["hits"] == 0
        tried = stats["nvme"]["corrupt"]  # 0-6: the levels' readers race, and PFS may serve every chunk first
        # Without the PFS replicas (and the host copies the hits promoted), the NVMe copies not tried yet are
        # read, found corrupt and refused too.
        store.drop_tier_copies(TierKind.HOST)
        store.drop_tier_copies(TierKind.PFS)
        assert not any(store.get_many(keys, [_empty(store) for _ in keys])), "a corrupt NVMe copy was served"
        assert store.stats()["tiers"]["nvme"]["corrupt"] == 6, f"{tried} found in the first read: each once"


def test_recovery_rebuilds_index(small_layout: KVLayout, tmp_path: Path) -> None:
    config = store_config(small_layout, tmp_path)
    with TieredStore(config) as store:
        tokens, keys, chunks = _chain(store, 5)
        store.put_many(keys, chunks)
    with TieredStore(config) as store:
        assert store.stats()["recovered_chunks"] == 5
        assert store.lookup(tokens) == 5 * 16
        outs = [_empty(store) for _ in keys]
        assert all(store.get_many(keys, outs))
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))


def test_corrupt_chunk_is_a_counted_miss(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path)) as store:
        tokens, keys, chunks = _chain(store, 2)
        store.put_many(keys, chunks)
        store.drop_tier_copies(TierKind.HOST)
        victim = next((tmp_path / "nvme").rglob(keys[1].hex() + "*"))
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0x55 if len(data) > 4096 + small_layout.chunk_bytes - 1 else 0
        data[4096 + 10] ^= 0x55
        victim.write_bytes(bytes(data))
        assert store.get_many(keys, [_empty(store), _empty(store)]) == [True, False]
        assert store.stats()["tiers"]["nvme"]["corrupt"] == 1
        assert not victim.exists() and store.lookup(tokens) == 16


def _stall_nvme(store: Any, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Fault injection: the NVMe tier's writes block until the returned event is set (a stalled disk)."""
    nvme = store.levels[1].tier
    release = threading.Event()
    release.entered = threading.Event()  # type: ignore[attr-defined]  # set once a write is stuck in the stall
    real_put = nvme.put
    monkeypatch.setattr(nvme, "put", lambda *a: (release.entered.set(), release.wait(10), real_put(*a))[2])  # type: ignore[attr-defined]
    return release


def test_backpressure_not_stored_is_named(small_layout: KVLayout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the disk stalled, the host fills with chunks still waiting to be written (pinned as
    write sources): later puts wait put_timeout_s, then name each chunk they could not store."""
    config = store_config(small_layout, tmp_path, host_chunks=2, write_queue_depth=1, writers_per_tier=1,
                          put_timeout_s=0.2)
    with TieredStore(config) as store:
        release = _stall_nvme(store, monkeypatch)
        _, keys, chunks = _chain(store, 6)
        result = store.put_many(keys, chunks)
        # tail first: the writer holds keys[5], the queue keys[4]; the rest find the host pinned
        assert result.stored == keys[4:] and set(result.not_stored) == set(keys[:4])
        assert all("pinned" in reason for reason in result.not_stored.values())
        assert store.stats()["not_stored"] == 4
        release.set()
        store.flush()
        assert store.put_many(keys[2:], chunks[2:]).ok


def test_backpressure_not_replicated_is_named_and_later_demoted(small_layout: KVLayout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full write queue leaves the chunk in the host only, says so, and eviction demotes it."""
    config = store_config(small_layout, tmp_path, host_chunks=4, write_queue_depth=1, writers_per_tier=1,
                          put_timeout_s=0.2)
    with TieredStore(config) as store:
        release = _stall_nvme(store, monkeypatch)
        _, keys, chunks = _chain(store, 4)
        result = store.put_many(keys, chunks)
        assert result.ok and result.stored == keys
        assert set(result.not_replicated) == set(keys[:2])  # tail first: the writer holds 1, the queue 1
        assert all("write queue full" in r for r in result.not_replicated.values())
        assert store.stats()["tiers"]["nvme"]["not_replicated"] == 2
        release.set()
        store.flush()
        _, more_keys, more_chunks = _chain(store, 4, seed=1)
        assert store.put_many(more_keys, more_chunks).ok  # evicts the first four from the host
        assert store.stats()["tiers"]["host"]["demotions"] == 2
        outs = [_empty(store) for _ in keys]
        assert store.get_many(keys, outs) == [True] * 4
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))


def test_pinned_chunks_are_not_evicted(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path, host_chunks=2, nvme_chunks=0, put_timeout_s=0.1)) as store:
        _, keys, chunks = _chain(store, 4)
        store.put_many(keys[:2], chunks[:2])
        assert store.pin(keys[:2]) == 2
        result = store.put_many(keys[2:], chunks[2:])
        assert len(result.not_stored) == 2 and store.lookup_keys(keys) == 2
        store.unpin(keys[:2])
        assert store.put_many(keys[2:], chunks[2:]).ok


def test_threads_put_get_evict_no_wrong_bytes(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(store_config(small_layout, tmp_path, host_chunks=6, nvme_chunks=40)) as store:
        chains = [_chain(store, 5, seed=s) for s in range(8)]
        errors: list[str] = []

        def worker(seeds: Any) -> None:
            for _ in range(3):
                for s in seeds:
                    _, keys, chunks = chains[s]
                    store.put_many(keys, chunks)
                    outs = [_empty(store) for _ in keys]
                    for ok, out, chunk in zip(store.get_many(keys, outs), outs, chunks, strict=True):
                        if ok and not torch.equal(out, chunk):
                            errors.append(f"wrong bytes for chain {s}")

        threads = [threading.Thread(target=worker, args=([i, (i + 3) % 8, (i + 5) % 8],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        store.flush()
        stats = store.stats()
        assert stats["tiers"]["host"]["evictions"] > 0
        for s in range(8):  # everything is on NVMe (40 chunks of room for 40)
            _, keys, chunks = chains[s]
            outs = [_empty(store) for _ in keys]
            assert all(store.get_many(keys, outs)), stats
            assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))


def test_listeners_see_stores_and_removals(small_layout: KVLayout, tmp_path: Path) -> None:
    events = []
    with TieredStore(store_config(small_layout, tmp_path, host_chunks=1)) as store:
        store.add_listener(lambda e: events.append((e.kind, e.key, e.tier)))
        _, keys, chunks = _chain(store, 2)
        store.put_many(keys, chunks)
        store.flush()
        store.remove(keys[1])
        assert ("stored", keys[0], TierKind.HOST) in events and ("stored", keys[0], TierKind.NVME) in events
        assert ("removed", keys[1], TierKind.HOST) in events  # the tail, evicted by the head (tail first)
        assert ("removed", keys[1], TierKind.NVME) in events
        assert store.resident_keys() == [(keys[0], [TierKind.HOST, TierKind.NVME])]


def test_chunks_of_another_layout_are_never_served(small_layout: KVLayout, tmp_path: Path) -> None:
    """Two models sharing one NVMe directory: a chunk's layout fingerprint keeps them apart."""
    with TieredStore(store_config(small_layout, tmp_path)) as store:
        _, keys, chunks = _chain(store, 3)
        store.put_many(keys, chunks)
    other = small_layout.with_dtype("bfloat16")
    # room for exactly 64 chunk files (12 KiB each: 4 KiB header block + 8 KiB payload)
    with TieredStore(store_config(other, tmp_path, nvme_chunks=48)) as store:
        assert store.stats()["foreign_chunks"] == 3 and store.stats()["chunks"] == 0
        assert store.lookup_keys(keys) == 0
        out = torch.empty(other.chunk_shape, dtype=other.torch_dtype)
        assert not store.get(keys[0], out)
        # ...and their space is reclaimed when this model needs it.
        _, other_keys, _ = _chain(store, 64, seed=3)
        filler = [make_chunk(other, i) for i in range(64)]
        assert store.put_many(other_keys, filler).ok
        store.flush()
        assert store.stats()["tiers"]["nvme"]["chunks"] == 64  # the 3 foreign files were evicted
        assert len(list((tmp_path / "nvme").rglob("*.kvc"))) == 64


def test_wait_durable_waits_for_own_keys_only(small_layout: KVLayout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with TieredStore(store_config(small_layout, tmp_path, writers_per_tier=1)) as store:
        _, keys, chunks = _chain(store, 2)
        store.put_many(keys, chunks)
        assert store.wait_durable(keys, timeout_s=5) == []
        release = _stall_nvme(store, monkeypatch)
        _, more, more_chunks = _chain(store, 1, seed=1)
        store.put_many(more, more_chunks)
        assert store.wait_durable(more, timeout_s=0.1) == more  # still only in host memory
        assert store.wait_durable(keys, timeout_s=0.1) == []
        release.set()
        assert store.wait_durable(more, timeout_s=5) == []


def test_remove_during_a_queued_write_is_not_undone(small_layout: KVLayout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a chunk removed while its NVMe copy was being written came back (the writer
    re-created the index entry when it finished)."""
    with TieredStore(store_config(small_layout, tmp_path, writers_per_tier=1)) as store:
        release = _stall_nvme(store, monkeypatch)
        _, keys, chunks = _chain(store, 1)
        store.put_many(keys, chunks)
        assert release.entered.wait(5)  # type: ignore[attr-defined]  # the writer is inside the stalled NVMe put
        assert store.remove(keys[0])
        release.set()
        store.flush()
        assert not store.contains(keys[0])
        assert not store.get(keys[0], _empty(store))
        assert list((tmp_path / "nvme").rglob("*.kvc")) == []


def test_full_disk_is_counted_and_loses_nothing_committed(small_layout: KVLayout, tmp_path: Path) -> None:
    """A real full filesystem (a 64 KiB tmpfs) under the NVMe tier: puts still succeed in the host
    tier, the failed disk writes are counted, the daemon-style caller sees no exception, and the
    chunks that reached the disk before it filled stay readable."""
    from tests.tiers.conftest import mounted

    with mounted("tmpfs", tmp_path / "nvme", "size=64k"):
        # the tier thinks it has room for 64 chunks; the filesystem holds about five
        with TieredStore(store_config(small_layout, tmp_path, host_chunks=32)) as store:
            _, keys, chunks = _chain(store, 12)
            assert store.put_many(keys, chunks).ok
            store.flush()
            stats = store.stats()["tiers"]["nvme"]
            assert stats["not_replicated"] >= 1 and stats["chunks"] + stats["not_replicated"] == 12
            on_disk = [k for k, _ in store.levels[1].tier.keys()]
            store.drop_tier_copies(TierKind.HOST)  # chunks without a disk copy try to demote, fail, are dropped
            outs = [_empty(store) for _ in keys]
            found = store.get_many(keys, outs)
            assert [k for k, ok in zip(keys, found, strict=True) if ok] == [k for k in keys if k in on_disk]
            assert all(torch.equal(o, c) for o, c, ok in zip(outs, chunks, found, strict=True) if ok)
