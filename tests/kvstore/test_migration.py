"""Chunk files written before the blosc2 codecs still read back through today's store, bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import xxhash

from kvstore.chunk_format import ChunkHeader
from kvstore.config import StoreConfig, TierConfig
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "migration_v1"


def test_old_chunk_files_decode_to_what_their_writer_decoded(tmp_path: Path) -> None:
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    layout = KVLayout.from_dict(manifest["layout"])
    shutil.copytree(FIXTURE / "nvme", tmp_path / "nvme")
    tiers = (TierConfig(kind=TierKind.HOST, capacity_bytes=8 * layout.chunk_bytes),
             TierConfig(kind=TierKind.NVME, capacity_bytes=1 << 20, path=str(tmp_path / "nvme")))
    config = StoreConfig(layout=layout, tiers=tiers, model_id=manifest["model_id"], allow_lossy=True)
    assert {c["codec_id"] for c in manifest["chunks"]} == {0, 1, 2, 3}
    with TieredStore(config) as store:
        for chunk in manifest["chunks"]:
            header = ChunkHeader.unpack((FIXTURE / "nvme" / chunk["file"]).read_bytes())
            assert header.codec_id == chunk["codec_id"]
            start, stop = chunk["token_ids"]
            key = store.chunk_keys(list(range(start, stop)))[0]
            assert key.hex() == chunk["key"]  # the key derivation did not change either
            assert store.lookup(list(range(start, stop))) == layout.chunk_tokens
            out = store.empty_chunk()
            assert store.get(key, out), f"{chunk['codec']} chunk not readable"
            decoded = xxhash.xxh3_64_hexdigest(out.view(torch.uint8).numpy().tobytes())
            assert decoded == chunk["decoded_xxh3_64"], f"{chunk['codec']} decodes differently now"
            if chunk["codec"] in ("none", "lz4"):
                assert decoded == chunk["raw_xxh3_64"]


FIXTURE_V2 = FIXTURE.parent / "migration_v2"


def test_chunks_of_the_retired_lz4_and_of_earlier_blosc_settings_decode_bit_for_bit(tmp_path: Path) -> None:
    """Written at 8f6ca60: `lz4` (now retired for writing) and blosc-lz4/blosc-zstd with that commit's
    defaults (bitshuffle, level 1, blosc2's own block size; blosc-zstd now writes 1 MiB blocks)."""
    manifest = json.loads((FIXTURE_V2 / "manifest.json").read_text())
    layout = KVLayout.from_dict(manifest["layout"])
    shutil.copytree(FIXTURE_V2 / "nvme", tmp_path / "nvme")
    tiers = (TierConfig(kind=TierKind.HOST, capacity_bytes=8 * layout.chunk_bytes),
             TierConfig(kind=TierKind.NVME, capacity_bytes=1 << 22, path=str(tmp_path / "nvme"), codec="blosc-zstd"))
    config = StoreConfig(layout=layout, tiers=tiers, model_id=manifest["model_id"])
    codec_ids = {ChunkHeader.unpack((FIXTURE_V2 / "nvme" / c["file"]).read_bytes()).codec_id for c in manifest["chunks"]}
    assert codec_ids == {1, 4, 5}
    with TieredStore(config) as store:
        for chunk in manifest["chunks"]:
            start, stop = chunk["token_ids"]
            key = store.chunk_keys(list(range(start, stop)))[0]
            assert key.hex() == chunk["key"]
            out = store.empty_chunk()
            assert store.get(key, out), f"{chunk['codec']} chunk not readable"
            decoded = xxhash.xxh3_64_hexdigest(out.view(torch.uint8).numpy().tobytes())
            assert decoded == chunk["raw_xxh3_64"], f"{chunk['codec']} chunk decodes differently now"


FIXTURE_V3 = FIXTURE.parent / "migration_v3"


def test_a_chunk_of_the_zstd_codec_as_first_written_decodes_bit_for_bit(tmp_path: Path) -> None:
    """Written when `zstd` (id 7) came in: two pieces, the exponent plane coded, the mantissas raw."""
    manifest = json.loads((FIXTURE_V3 / "manifest.json").read_text())
    layout = KVLayout.from_dict(manifest["layout"])
    shutil.copytree(FIXTURE_V3 / "nvme", tmp_path / "nvme")
    tiers = (TierConfig(kind=TierKind.HOST, capacity_bytes=8 * layout.chunk_bytes),
             TierConfig(kind=TierKind.NVME, capacity_bytes=1 << 23, path=str(tmp_path / "nvme"), codec="zstd"))
    (chunk,) = manifest["chunks"]
    assert ChunkHeader.unpack((FIXTURE_V3 / "nvme" / chunk["file"]).read_bytes()).codec_id == 7
    with TieredStore(StoreConfig(layout=layout, tiers=tiers, model_id=manifest["model_id"])) as store:
        start, stop = chunk["token_ids"]
        key = store.chunk_keys(list(range(start, stop)))[0]
        assert key.hex() == chunk["key"]
        out = store.empty_chunk()
        assert store.get(key, out), "the zstd chunk is not readable"
        assert xxhash.xxh3_64_hexdigest(out.view(torch.uint8).numpy().tobytes()) == chunk["raw_xxh3_64"]
