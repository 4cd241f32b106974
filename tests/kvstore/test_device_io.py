"""A disk tier that reads straight into device memory gets the caller's buffer, not the staging one.

Regression: the mover probed `getattr(level.tier, "supports_device_io", False)`, a name no tier
defined (NVMeTier says `uses_kvikio`), so with kvikio present every disk read into a CUDA buffer
still went through the host staging buffer and the GPUDirect path could never be taken. Without
CUDA, the test stands in a `meta` tensor for device memory and an NVMe tier that reports kvikio and
records the buffer each read received.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from tests.conftest import make_chunk, store_config
from tiers.nvme import NVMeTier


class RecordingNVMeTier(NVMeTier):
    """An NVMe tier that reports the kvikio (device I/O) path and records each read's buffer.

    A "device" read is served by reading the file into host memory (what kvikio would DMA into
    the device buffer): the point is which buffer the store hands over.
    """

    def __init__(self, *, kvikio: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kvikio = kvikio
        self.buffers: list[torch.Tensor] = []

    @property
    def uses_kvikio(self) -> bool:
        return self.kvikio

    def get_into(self, key: bytes, out: torch.Tensor) -> int | None:
        self.buffers.append(out)
        if out.device.type == "cpu":
            return super().get_into(key, out)
        return super().get_into(key, torch.empty(out.numel(), dtype=torch.uint8))


def _disk_only_store(tmp_path: Path, layout: Any, *, kvikio: bool) -> tuple[TieredStore, RecordingNVMeTier, list[bytes]]:
    store = TieredStore(store_config(layout, tmp_path, promote_on_read=False))
    nvme = next(level for level in store.levels if level.kind is TierKind.NVME)
    nvme.tier.close()
    nvme.tier = RecordingNVMeTier(kvikio=kvikio, path=tmp_path / "nvme2", capacity_bytes=nvme.config.capacity_bytes)
    keys = store.chunk_keys(torch.arange(2 * layout.chunk_tokens, dtype=torch.int32))
    assert store.put_many(keys, [make_chunk(layout, i) for i in range(len(keys))]).ok
    store.flush()
    store.drop_tier_copies(TierKind.HOST)  # now only the NVMe tier holds them
    return store, nvme.tier, keys


def test_device_io_tier_reads_into_the_destination(small_layout: KVLayout, tmp_path: Path) -> None:
    store, tier, keys = _disk_only_store(tmp_path, small_layout, kvikio=True)
    with store:
        outs = [torch.empty(small_layout.chunk_shape, dtype=small_layout.torch_dtype, device="meta") for _ in keys]
        assert store.get_many(keys, outs) == [True, True]
    assert len(tier.buffers) == len(keys)
    assert all(buf.device.type == "meta" for buf in tier.buffers), [buf.device for buf in tier.buffers]


def test_tier_without_device_io_reads_through_staging(small_layout: KVLayout, tmp_path: Path) -> None:
    store, tier, keys = _disk_only_store(tmp_path, small_layout, kvikio=False)
    with store:
        outs = [torch.empty(small_layout.chunk_shape, dtype=small_layout.torch_dtype, device="meta") for _ in keys]
        assert store.get_many(keys, outs) == [True, True]
    assert len(tier.buffers) == len(keys)
    assert all(buf.device.type == "cpu" for buf in tier.buffers)  # the host staging buffer


def test_host_destination_is_read_in_place_either_way(small_layout: KVLayout, tmp_path: Path) -> None:
    store, tier, keys = _disk_only_store(tmp_path, small_layout, kvikio=False)
    with store:
        outs = [store.empty_chunk() for _ in keys]
        assert store.get_many(keys, outs) == [True, True]
        assert torch.equal(outs[1], make_chunk(small_layout, 1))
    assert [buf.data_ptr() for buf in tier.buffers] == [out.data_ptr() for out in outs]
