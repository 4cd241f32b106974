"""Stores that behave as cluster nodes: own host and NVMe tiers, a shared PFS directory, optional Redis tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvstore.cluster import ClusterConfig, ClusterNode
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="float16", chunk_tokens=16)  # 8 KiB chunks


def node_store(root: Path, name: str, *, shared_pfs: Path | None = None, redis_url: str | None = None,
               host_chunks: int = 16, pfs_chunks: int = 256) -> TieredStore:
    chunk = LAYOUT.chunk_bytes + 8192
    tiers = [TierConfig(kind=TierKind.HOST, capacity_bytes=host_chunks * LAYOUT.chunk_bytes),
             TierConfig(kind=TierKind.NVME, capacity_bytes=256 * chunk, path=str(root / name / "nvme"))]
    if shared_pfs is not None:
        tiers.append(TierConfig(kind=TierKind.PFS, capacity_bytes=pfs_chunks * chunk, path=str(shared_pfs)))
    if redis_url is not None:
        tiers.append(TierConfig(kind=TierKind.REDIS, capacity_bytes=256 * chunk,
                                options={"url": redis_url, "prefix": "kvtest", "socket_timeout_s": 0.5,
                                         "connect_timeout_s": 0.2, "retry_after_s": 0.2}))
    return TieredStore(StoreConfig(layout=LAYOUT, tiers=tuple(tiers), model_id="test-model", put_timeout_s=2.0))


def cluster_config(redis_url: str, node_id: str, **overrides: Any) -> ClusterConfig:
    options = {"url": redis_url, "cluster_name": "test", "node_id": node_id, "flush_interval_s": 0.01,
               "socket_timeout_s": 0.5, "retry_s": 0.1, "heartbeat_s": 0.5, "entry_ttl_s": 5.0, **overrides}
    return ClusterConfig(**options)


def join(store: TieredStore, redis_url: str, node_id: str, **overrides: Any) -> ClusterNode:
    return ClusterNode(store, cluster_config(redis_url, node_id, **overrides))


def prompt(num_chunks: int, seed: int) -> torch.Tensor:
    start = seed * 100_000
    return torch.arange(start, start + num_chunks * LAYOUT.chunk_tokens, dtype=torch.int32)


def chunk_of(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(LAYOUT.chunk_shape, generator=generator).to(LAYOUT.torch_dtype)


def empty_chunk() -> torch.Tensor:
    return torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
