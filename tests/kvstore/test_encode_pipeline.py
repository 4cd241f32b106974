"""A compressed tier's write pipeline (Level.encode, Mover.start_writers): chunks encode side by side, one per
writer thread and at most `encoders` at once, while other writers write what is coded. Many concurrent puts
read back byte-identical, a write goes on while other encodes hold slots, and a disk that fills mid-pipeline
loses nothing committed (real files, a real tmpfs, real tensors)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import torch

from kvstore.chunk_format import ChunkHeader
from kvstore.config import StoreConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from policies.compression import make_codec
from tests.conftest import make_chunk, store_config
from tests.tiers.conftest import mounted

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype="bfloat16", chunk_tokens=128)  # 256 KiB
ZSTD_ID = make_codec("zstd").codec_id


def _zstd_config(tmp_path: Path, nvme: Path | None = None, nvme_chunks: int = 64) -> StoreConfig:
    config = store_config(LAYOUT, tmp_path, host_chunks=40, nvme_chunks=nvme_chunks)
    tiers = tuple(dataclasses.replace(t, codec="zstd", codec_threads=2, path=str(nvme or t.path),
                                      raw_when_encoder_busy=False)
                  if t.kind is TierKind.NVME else t for t in config.tiers)
    return dataclasses.replace(config, tiers=tiers)


def _codec_ids(root: Path) -> list[int]:
    return [ChunkHeader.unpack(path.read_bytes()).codec_id for path in root.rglob("*.kvc")]


def _read_back(store: TieredStore, keys: list[bytes], chunks: list[torch.Tensor]) -> None:
    outs = [store.empty_chunk() for _ in keys]
    assert all(store.get_many(keys, outs))
    for i, (out, chunk) in enumerate(zip(outs, chunks, strict=True)):
        assert torch.equal(out.view(torch.uint8), chunk.view(torch.uint8)), f"chunk {i} came back changed"


def test_a_coding_tier_gets_a_writer_per_encoder_beyond_its_writers(tmp_path: Path) -> None:
    with TieredStore(_zstd_config(tmp_path)) as store:
        nvme = store.levels[1]
        assert nvme.encoders == 2
        assert len(nvme.threads) == store.config.writers_per_tier + 2
    with TieredStore(store_config(LAYOUT, tmp_path / "raw")) as raw_store:
        assert len(raw_store.levels[1].threads) == raw_store.config.writers_per_tier


def test_many_concurrent_puts_are_coded_and_read_back_identical(tmp_path: Path) -> None:
    with TieredStore(_zstd_config(tmp_path)) as store:
        keys = store.chunk_keys(list(range(32 * LAYOUT.chunk_tokens)))
        chunks = [make_chunk(LAYOUT, i) for i in range(32)]
        errors: list[BaseException] = []

        def put(part: int) -> None:
            try:  # each thread its own keys: eight puts of one chunk, interleaved with the others'
                for i in range(part, 32, 4):
                    assert store.put_many([keys[i]], [chunks[i]]).ok
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=put, args=(part,)) for part in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert store.flush(timeout_s=60)
        assert sorted(_codec_ids(tmp_path / "nvme")) == [ZSTD_ID] * 32
        store.drop_tier_copies(TierKind.HOST)  # every chunk now comes from its NVMe file
        _read_back(store, keys, chunks)


def test_a_write_goes_on_while_other_encodes_hold_slots(tmp_path: Path) -> None:
    """With one encoder of two free a write codes and lands; the single encode lock this replaced held it."""
    with TieredStore(_zstd_config(tmp_path)) as store:
        keys = store.chunk_keys(list(range(3 * LAYOUT.chunk_tokens)))
        chunks = [make_chunk(LAYOUT, i) for i in range(3)]
        nvme = store.levels[1]
        with nvme.encoders_held(nvme.encoders - 1):
            assert store.put_many(keys, chunks).ok
            assert store.flush(timeout_s=30), "no write finished with an encoder free"
        assert _codec_ids(tmp_path / "nvme") == [ZSTD_ID] * 3


def test_a_disk_that_fills_mid_pipeline_loses_nothing_committed(tmp_path: Path) -> None:
    with mounted("tmpfs", tmp_path / "small", "size=4m") as root:
        config = _zstd_config(tmp_path, root / "nvme", nvme_chunks=12)
        first = [make_chunk(LAYOUT, i) for i in range(4)]
        second = [make_chunk(LAYOUT, 100 + i) for i in range(8)]
        with TieredStore(config) as store:
            keys = store.chunk_keys(list(range(12 * LAYOUT.chunk_tokens)))
            assert store.put_many(keys[:4], first).ok and store.flush(timeout_s=60)
            # another writer fills the filesystem but for about 200 KiB: one coded chunk file at most
            used = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
            (root / "filler").write_bytes(b"\0" * ((4 << 20) - used - (200 << 10)))
            result = store.put_many(keys[4:], second)
            assert result.ok, "the host tier holds every chunk: the puts themselves succeed"
            assert store.flush(timeout_s=60)
            stats = store.stats()["tiers"]["nvme"]
            assert stats["write_errors_ENOSPC"] >= 7, stats
            _read_back(store, keys, first + second)  # from NVMe or from the host copy
        assert not [p for p in root.rglob("*") if ".tmp" in p.name], "a failed write left a temp file"
        (root / "filler").unlink()
        with TieredStore(config) as reopened:  # the index rebuilt from the chunk files alone
            held = [k for k in keys if reopened.contains(k)]
            assert set(keys[:4]) <= set(held) and len(held) <= 5
            _read_back(reopened, held, [(first + second)[keys.index(k)] for k in held])
