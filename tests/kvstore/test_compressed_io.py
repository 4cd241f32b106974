"""The compressed NVMe path moves its bytes in place: blosc payloads and the store's read staging buffer
are 4 KiB-aligned, so an O_DIRECT tier writes and reads them without a copy through its staging buffer."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from bench.kv_model import model_chunk
from kvstore.chunk_format import ALIGN, aligned_empty
from kvstore.layout import KVLayout
from kvstore.store.levels import StagingBuffers, decode_into
from kvstore.types import ChunkMeta
from policies.compression import make_codec
from tests.tiers.conftest import key_of
from tiers import file_io
from tiers.nvme import NVMeTier

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype="bfloat16", chunk_tokens=128)  # 256 KiB


@pytest.mark.parametrize("nbytes", [0, 1, ALIGN - 1, ALIGN, 3 * ALIGN + 5])
def test_aligned_empty_starts_on_a_block(nbytes: int) -> None:
    buf = aligned_empty(nbytes)
    assert buf.numel() == nbytes and buf.dtype == torch.uint8
    assert buf.data_ptr() % ALIGN == 0


@pytest.mark.parametrize("name", ["blosc-lz4", "blosc-zstd", "zstd"])
def test_compressed_payloads_and_read_staging_are_block_aligned(name: str) -> None:
    payload = make_codec(name, threads=1).encode(model_chunk(LAYOUT, seed=3), LAYOUT)
    assert 0 < payload.numel() < LAYOUT.chunk_bytes  # compressed, so not a whole number of blocks by luck
    assert payload.data_ptr() % ALIGN == 0
    staging = StagingBuffers()
    for nbytes in (payload.numel(), 3 * payload.numel(), payload.numel() // 2):  # grows, then is reused
        assert staging.get(nbytes).data_ptr() % ALIGN == 0


def test_compressed_chunk_goes_through_o_direct_without_staging_copies(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # This thread's staging buffer from the start: an earlier test in this process (another order, another
    # xdist worker's share of the files) may have grown it already, which says nothing of this path.
    monkeypatch.setattr(file_io, "_local", threading.local())
    chunk = model_chunk(LAYOUT, seed=4)
    codec = make_codec("blosc-lz4", threads=1)
    payload = codec.encode(chunk, LAYOUT)
    meta = ChunkMeta(codec_id=codec.codec_id, raw_bytes=LAYOUT.chunk_bytes, stored_bytes=payload.numel(),
                     layout_fingerprint=LAYOUT.fingerprint)
    tier = NVMeTier(path=str(tmp_path / "nvme"), capacity_bytes=64 << 20, direct_io=True)
    try:
        tier.put(key_of(1), payload, meta)
        target = StagingBuffers().get(payload.numel())
        assert tier.get_into(key_of(1), target) == payload.numel()
        if not tier.direct_io:
            pytest.skip(f"{tmp_path} refuses O_DIRECT: buffered I/O never stages")
    finally:
        tier.close()
    out = torch.empty(LAYOUT.chunk_bytes, dtype=torch.uint8)
    decode_into(meta, target, out, LAYOUT)
    assert torch.equal(out, chunk.reshape(-1).view(torch.uint8))
    # An unaligned payload would have moved through this thread's staging buffer in pieces of up to
    # 8 MiB; aligned ones use only its head and tail blocks.
    assert file_io.staging_buffer(ALIGN).numel() == ALIGN
    assert file_io._local.staging.numel() <= 2 * ALIGN
