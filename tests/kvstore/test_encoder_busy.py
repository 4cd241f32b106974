"""`raw_when_encoder_busy`: a background write that finds the tier's codec held by another chunk stores its
chunk raw instead of waiting; without the option it waits and compresses. Either way every chunk reads back
as written (each file names its own codec)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from kvstore.chunk_format import ChunkHeader
from kvstore.config import StoreConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from policies.compression import make_codec
from tests.conftest import make_chunk, store_config

ZSTD_ID = make_codec("zstd").codec_id


def _config(layout: KVLayout, tmp_path: Path, *, raw_when_busy: bool) -> StoreConfig:
    config = store_config(layout, tmp_path)
    tiers = tuple(dataclasses.replace(t, codec="zstd", raw_when_encoder_busy=raw_when_busy)
                  if t.kind is TierKind.NVME else t for t in config.tiers)
    return dataclasses.replace(config, tiers=tiers)


def _codec_ids(tmp_path: Path) -> list[int]:
    return sorted(ChunkHeader.unpack(path.read_bytes()).codec_id for path in (tmp_path / "nvme").rglob("*.kvc"))


def _put(store: TieredStore, keys: list[bytes], chunks: list[torch.Tensor]) -> None:
    assert store.put_many(keys, chunks).ok


def test_a_write_that_finds_the_encoder_busy_goes_raw_and_reads_back(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(_config(small_layout, tmp_path, raw_when_busy=True)) as store:
        keys = store.chunk_keys(list(range(4 * small_layout.chunk_tokens)))
        chunks = [make_chunk(small_layout, i) for i in range(4)]
        nvme = store.levels[1]
        with nvme.encoders_held():  # other chunks' encodes hold every encoder
            _put(store, keys[:2], chunks[:2])
            assert store.flush(timeout_s=30), "the writes did not wait for the encoder"
        for key, chunk in zip(keys[2:], chunks[2:], strict=True):  # one at a time: each finds the encoder free
            _put(store, [key], [chunk])
            assert store.flush(timeout_s=30)
        assert _codec_ids(tmp_path) == [0, 0, ZSTD_ID, ZSTD_ID]
        store.drop_tier_copies(TierKind.HOST)
        outs = [store.empty_chunk() for _ in keys]
        assert all(store.get_many(keys, outs))
        assert all(torch.equal(a, b) for a, b in zip(chunks, outs, strict=True))


def test_without_the_option_a_write_waits_for_the_encoder(small_layout: KVLayout, tmp_path: Path) -> None:
    with TieredStore(_config(small_layout, tmp_path, raw_when_busy=False)) as store:
        keys = store.chunk_keys(list(range(2 * small_layout.chunk_tokens)))
        chunks = [make_chunk(small_layout, i) for i in range(2)]
        with store.levels[1].encoders_held():
            _put(store, keys, chunks)
            assert not store.flush(timeout_s=0.3), "a write finished while the encoder was held"
            assert _codec_ids(tmp_path) == []
        assert store.flush(timeout_s=30)
        assert _codec_ids(tmp_path) == [ZSTD_ID, ZSTD_ID]
