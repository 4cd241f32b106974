"""Tiny factories shared by the test suite: small layouts, store configs on tmp_path, chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.types import TierKind


@pytest.fixture
def small_layout() -> KVLayout:
    # 2 layers x 2 planes x 16 tokens x 2 heads x 32 dims x 2 bytes = 8 KiB per chunk
    return KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="float16", chunk_tokens=16)


def make_chunk(layout: KVLayout, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(layout.chunk_shape, generator=generator).to(layout.torch_dtype)


def store_config(layout: KVLayout, tmp_path: Path, *, host_chunks: int = 8, nvme_chunks: int = 64,
                 pfs_chunks: int | None = None, **overrides: Any) -> StoreConfig:
    tiers = [TierConfig(kind=TierKind.HOST, capacity_bytes=host_chunks * layout.chunk_bytes)]
    if nvme_chunks:
        tiers.append(TierConfig(kind=TierKind.NVME, capacity_bytes=nvme_chunks * (layout.chunk_bytes + 8192),
                                path=str(tmp_path / "nvme")))
    if pfs_chunks:
        tiers.append(TierConfig(kind=TierKind.PFS, capacity_bytes=pfs_chunks * (layout.chunk_bytes + 8192),
                                path=str(tmp_path / "pfs")))
    overrides.setdefault("put_timeout_s", 2.0)
    return StoreConfig(layout=layout, tiers=tuple(tiers), model_id="test-model", **overrides)
