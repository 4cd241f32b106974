"""Compressed disk reads as a pipeline: the NVMe tier announces a payload's front as its segments land,
and the zstd decoder decodes each piece once its bytes are in; the result is the same bytes as a
whole-payload decode, and damage is still named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bench.kv_model import model_chunk
from kvstore.chunk_format import PAYLOAD_OFFSET, aligned_empty
from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import CorruptChunkError
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import ChunkMeta, TierKind
from policies.compression import make_codec
from policies.compression.stream_decoders import stream_decoder
from policies.compression.streaming import WholeDecoder
from policies.compression.zstd_planes import ZstdStreamDecoder
from tests.tiers.conftest import key_of
from tiers.chunk_files import SEGMENT_BYTES
from tiers.nvme import NVMeTier

BIG = KVLayout(num_layers=8, num_kv_heads=8, head_dim=128, dtype="bfloat16", chunk_tokens=256)  # 8 MiB: 8 pieces


@pytest.fixture(scope="module")
def chunk() -> torch.Tensor:
    return model_chunk(BIG, seed=5)


@pytest.fixture(scope="module")
def payload(chunk: torch.Tensor) -> torch.Tensor:
    return make_codec("zstd", threads=2).encode(chunk, BIG)


def _meta(payload: torch.Tensor, codec_id: int) -> ChunkMeta:
    return ChunkMeta(codec_id=codec_id, raw_bytes=BIG.chunk_bytes, stored_bytes=payload.numel(),
                     layout_fingerprint=BIG.fingerprint)


@pytest.mark.parametrize("step", [7919, 1 << 20, None])  # odd steps, piece-sized ones, the whole at once
def test_zstd_stream_decoder_equals_a_whole_decode(chunk: torch.Tensor, payload: torch.Tensor,
                                                   step: int | None) -> None:
    out = torch.empty_like(chunk)
    decoder = stream_decoder(make_codec("zstd", threads=2), payload, out, BIG)
    assert isinstance(decoder, ZstdStreamDecoder)
    for ready in range(step or payload.numel(), payload.numel(), step or payload.numel()):
        decoder.feed(ready)
    decoder.finish(payload.numel())
    assert torch.equal(out.view(torch.uint8), chunk.view(torch.uint8))


def test_zstd_stream_decoder_names_short_and_damaged_payloads(chunk: torch.Tensor, payload: torch.Tensor) -> None:
    codec = make_codec("zstd", threads=2)
    with pytest.raises(CorruptChunkError, match="table says"):
        stream_decoder(codec, payload, torch.empty_like(chunk), BIG).finish(payload.numel() - 1)
    with pytest.raises(CorruptChunkError, match="shorter than its header"):
        stream_decoder(codec, payload, torch.empty_like(chunk), BIG).finish(10)
    damaged = payload.clone()
    damaged[payload.numel() // 2 : payload.numel() // 2 + 64] ^= 0x5A  # inside a piece's zstd frame or raw plane
    decoder = stream_decoder(codec, damaged, torch.empty_like(chunk), BIG)
    decoder.feed(payload.numel() // 3)
    try:
        decoder.finish(payload.numel())
    except CorruptChunkError:
        pass  # a damaged frame; a damaged raw plane decodes, and the tier's checksum names it instead


def test_other_codecs_and_device_outputs_decode_whole(chunk: torch.Tensor) -> None:
    blosc = make_codec("blosc-lz4", threads=1)
    encoded = blosc.encode(chunk, BIG)
    out = torch.empty_like(chunk)
    decoder = stream_decoder(blosc, encoded, out, BIG)
    assert isinstance(decoder, WholeDecoder)
    decoder.feed(encoded.numel() // 2)
    decoder.finish(encoded.numel())
    assert torch.equal(out.view(torch.uint8), chunk.view(torch.uint8))


def _tier(tmp_path: Path) -> NVMeTier:
    return NVMeTier(path=str(tmp_path / "nvme"), capacity_bytes=256 << 20, direct_io=True)


def test_nvme_streamed_read_announces_growing_fronts(tmp_path: Path, payload: torch.Tensor) -> None:
    assert payload.numel() > 2 * SEGMENT_BYTES  # several segments
    tier = _tier(tmp_path)
    try:
        tier.put(key_of(1), payload, _meta(payload, 7))
        target = aligned_empty(payload.numel())
        announced: list[int] = []
        assert tier.get_into_streamed(key_of(1), target, announced.append) == payload.numel()
        assert torch.equal(target, payload)
        assert len(announced) >= 3 and announced == sorted(set(announced)) and announced[-1] == payload.numel()
        assert tier.get_into_streamed(key_of(2), target, announced.append) is None  # a miss announces nothing
    finally:
        tier.close()


def test_nvme_streamed_read_of_a_damaged_file_is_corrupt_and_dropped(tmp_path: Path, payload: torch.Tensor) -> None:
    tier = _tier(tmp_path)
    try:
        tier.put(key_of(1), payload, _meta(payload, 7))
        path = tier.chunk_path(key_of(1))
        fd = os.open(path, os.O_RDWR)
        try:
            at = PAYLOAD_OFFSET + SEGMENT_BYTES + 123  # in the second segment
            os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)
        finally:
            os.close(fd)
        with pytest.raises(CorruptChunkError, match="checksum"):
            tier.get_into_streamed(key_of(1), aligned_empty(payload.numel()), lambda n: None)
        assert not os.path.exists(path) and tier.meta(key_of(1)) is None
    finally:
        tier.close()


@pytest.mark.parametrize("codec", ["zstd", "blosc-lz4", "none"])
def test_store_reads_big_compressed_chunks_back_from_disk(tmp_path: Path, codec: str, chunk: torch.Tensor) -> None:
    # Three distinct chunks with the model's statistics: the module's, its tokens reversed, its tokens rotated
    # (a model run per chunk costs seconds of CPU; dim 2 is the token dim of [layers, 2, tokens, heads, dim])
    chunks = [chunk, chunk.flip(2).contiguous(), chunk.roll(37, dims=2).contiguous()]
    config = StoreConfig(layout=BIG, promote_on_read=False, tiers=(
        TierConfig(kind=TierKind.HOST, capacity_bytes=64 << 20),
        TierConfig(kind=TierKind.NVME, capacity_bytes=256 << 20, path=str(tmp_path / "nvme"), codec=codec)))
    with TieredStore(config) as store:
        keys = [key_of(i) for i in range(len(chunks))]
        assert store.put_many(keys, chunks).ok
        store.flush()
        store.drop_tier_copies(TierKind.HOST)
        outs = [store.empty_chunk() for _ in chunks]
        assert all(store.get_many(keys, outs))
        assert store.stats()["tiers"]["nvme"]["used_bytes"] > 0
    for out, expected in zip(outs, chunks, strict=True):
        assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))
