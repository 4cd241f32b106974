"""One contract, two stores: the embedded TieredStore and KVStoreClient against a real `kvstore serve`
behave alike through the `ChunkStore` protocol the connector and the engine are typed with."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from connector.client import KVStoreClient
from kvstore.config import StoreConfig
from kvstore.store import TieredStore
from kvstore.types import ChunkStore
from tests.service.conftest import LAYOUT

_seeds = itertools.count(1)


@pytest.fixture(params=["embedded", "daemon"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChunkStore]:
    if request.param == "embedded":
        config = StoreConfig.embedded(layout=LAYOUT, root_dir=tmp_path, host_bytes=64 * LAYOUT.chunk_bytes,
                                      nvme_bytes=256 * (LAYOUT.chunk_bytes + 8192))
        with TieredStore(config) as embedded:
            yield embedded
    else:
        with KVStoreClient(request.getfixturevalue("daemon").url) as client:
            yield client


def _prompt(num_chunks: int) -> list[int]:
    start = next(_seeds) * 1_000_000  # the daemon is shared by the session: fresh prefixes each time
    return list(range(start, start + num_chunks * LAYOUT.chunk_tokens + 3))


def _chunks(n: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(LAYOUT.chunk_shape, generator=generator).to(LAYOUT.torch_dtype) for _ in range(n)]


def test_both_satisfy_the_protocol(store: ChunkStore) -> None:
    assert isinstance(store, ChunkStore)
    assert store.layout == LAYOUT


def test_put_lookup_get_remove(store: ChunkStore) -> None:
    tokens = _prompt(3)
    keys = store.chunk_keys(tokens)
    assert len(keys) == 3 and all(len(k) == 16 for k in keys)
    assert store.lookup(tokens) == 0 and not store.contains(keys[0])
    chunks = _chunks(3, seed=len(tokens))
    result = store.put_many(keys[:2], chunks[:2])
    assert result.ok and result.stored == keys[:2]
    assert store.flush(timeout_s=10)
    assert store.lookup(tokens) == 2 * LAYOUT.chunk_tokens
    assert store.lookup_keys(keys) == 2 and store.contains(keys[1])
    outs = [store.empty_chunk() for _ in keys]
    assert all(o.shape == LAYOUT.chunk_shape and o.dtype == LAYOUT.torch_dtype for o in outs)
    assert store.get_many(keys, outs) == [True, True, False]
    assert torch.equal(outs[0], chunks[0]) and torch.equal(outs[1], chunks[1])
    assert store.remove(keys[1])
    assert store.lookup_keys(keys) == 1 and not store.contains(keys[1])


def test_stats_count_the_chunks(store: ChunkStore) -> None:
    tokens = _prompt(2)
    keys = store.chunk_keys(tokens)
    before = store.stats()
    assert store.put_many(keys, _chunks(2, seed=7)).ok
    after = store.stats()
    assert isinstance(after["chunks"], int) and after["chunks"] >= before["chunks"] + 2
