"""The zero-copy host data plane: reserve/commit writes and leased reads straight in shared memory."""

from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import TierFullError
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from tests.conftest import make_chunk


def _shm_store(small_layout: KVLayout, tmp_path: Path, put_timeout_s: Any) -> Any:
    tiers = (TierConfig(kind=TierKind.HOST, capacity_bytes=2 * small_layout.chunk_bytes,
                        options={"shm_name": f"kvtest-{tmp_path.name[-20:]}"}),
             TierConfig(kind=TierKind.NVME, capacity_bytes=1 << 20, path=str(tmp_path / "nvme")))
    return TieredStore(StoreConfig(layout=small_layout, tiers=tiers, put_timeout_s=put_timeout_s))


@pytest.fixture
def shm_store(small_layout: KVLayout, tmp_path: Path) -> Iterator[Any]:
    with _shm_store(small_layout, tmp_path, put_timeout_s=10.0) as store:  # room for slow disks under load
        yield store


@pytest.fixture
def impatient_shm_store(small_layout: KVLayout, tmp_path: Path) -> Iterator[Any]:
    with _shm_store(small_layout, tmp_path, put_timeout_s=0.2) as store:
        yield store


def test_write_through_shared_memory_and_read_back(shm_store: Any) -> None:
    layout = shm_store.layout
    keys = shm_store.chunk_keys(list(range(3 * layout.chunk_tokens)))
    chunks = [make_chunk(layout, i) for i in range(3)]
    segment = shared_memory.SharedMemory(name=shm_store.host_shm_name)  # what another process would map
    try:
        arena = np.ndarray((segment.size,), dtype=np.uint8, buffer=segment.buf)
        for key, chunk in zip(keys, chunks, strict=True):
            res = shm_store.reserve(key)
            arena[res.offset:res.offset + res.nbytes] = chunk.view(torch.uint8).reshape(-1).numpy()
            assert shm_store.commit(res).ok
        shm_store.flush()
        assert shm_store.lookup_keys(keys) == 3  # the first was evicted from host but lives on NVMe
        for key, chunk in zip(keys, chunks, strict=True):
            lease = shm_store.acquire(key)
            assert lease is not None
            got = torch.from_numpy(arena[lease.offset:lease.offset + lease.nbytes].copy())
            assert torch.equal(got, chunk.view(torch.uint8).reshape(-1))
            shm_store.release(lease)
        del arena
    finally:
        segment.close()


def test_leased_slot_is_never_evicted(impatient_shm_store: Any) -> None:
    shm_store = impatient_shm_store
    layout = shm_store.layout
    keys = shm_store.chunk_keys(list(range(4 * layout.chunk_tokens)))
    shm_store.put_many(keys[:2], [make_chunk(layout, i) for i in range(2)])
    shm_store.flush()
    leases = [shm_store.acquire(k) for k in keys[:2]]
    with pytest.raises(TierFullError, match="pinned"):
        shm_store.reserve(keys[2])  # both host slots are leased
    for lease in leases:
        shm_store.release(lease)
    res = shm_store.reserve(keys[2])
    shm_store.abort(res)
    assert shm_store.acquire(b"\0" * 16) is None
