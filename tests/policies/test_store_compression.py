"""A store whose tiers use a codec reads back what it stored (lossless exactly, lossy within bound)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.kv_synth import synthetic_chunk
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="bfloat16", chunk_tokens=16)


@pytest.mark.parametrize("codec", ["lz4", "int8"])
def test_store_with_codec_on_disk_reads_back_what_it_stored(tmp_path: Path, codec: str) -> None:
    tiers = (TierConfig(kind=TierKind.HOST, capacity_bytes=1 << 20),
             TierConfig(kind=TierKind.NVME, capacity_bytes=1 << 24, path=str(tmp_path / "nvme"), codec=codec))
    config = StoreConfig(layout=LAYOUT, tiers=tiers, model_id="m", allow_lossy=codec == "int8")
    chunks = [synthetic_chunk(LAYOUT, seed=s) for s in range(3)]
    keys = [bytes([s]) * 16 for s in range(3)]
    with TieredStore(config) as store:
        assert store.put_many(keys, chunks).stored == keys
        store.flush()
        store.drop_tier_copies(TierKind.HOST)  # force reads from the encoded disk copies
        for key, chunk in zip(keys, chunks, strict=True):
            out = torch.empty_like(chunk)
            assert store.get(key, out)
            if codec == "lz4":
                assert torch.equal(out, chunk)
            else:
                x = chunk.float()
                amax = x.abs().amax(dim=-1, keepdim=True)
                assert ((out.float() - x).abs() <= amax / 254 + 2**-8 * out.float().abs()).all()
