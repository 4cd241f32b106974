"""A real TieredStore whose host tier evicts with `adaptive` (its own admission, as the store builds it)."""

from dataclasses import replace
from pathlib import Path

import torch

from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from tests.conftest import make_chunk, store_config


def test_adaptive_host_tier_keeps_its_capacity_and_every_chunk_reads_back(small_layout: KVLayout, tmp_path: Path) -> None:
    config = store_config(small_layout, tmp_path, host_chunks=4)
    host = config.tiers[0]
    assert host.kind is TierKind.HOST
    config = replace(config, tiers=(replace(host, eviction="adaptive"), *config.tiers[1:]))
    with TieredStore(config) as store:
        tokens = torch.arange(0, 12 * store.layout.chunk_tokens, dtype=torch.int32)
        keys = store.chunk_keys(tokens)
        chunks = [make_chunk(store.layout, i) for i in range(len(keys))]
        for _ in range(3):  # the same prefix again and again: reuse the policy sees
            assert store.put_many(keys, chunks).ok
        store.flush()
        stats = store.stats()["tiers"]
        assert stats["host"]["chunks"] <= 4 and stats["host"]["evictions"] > 0
        outs = [torch.empty(store.layout.chunk_shape, dtype=store.layout.torch_dtype) for _ in keys]
        assert all(store.get_many(keys, outs))
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))
