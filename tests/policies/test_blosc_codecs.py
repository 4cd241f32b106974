"""blosc2 and nvCOMP codecs on KV from the engine's own model: byte-identical round trips, shuffle
variants read by one codec id, codec threads, the nvCOMP CPU fallback and its GPU path."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from bench.kv_model import model_chunk
from kvstore.errors import ConfigError, TierIOError
from kvstore.layout import KVLayout
from policies.compression import codec_by_id, make_codec
from policies.compression.nvcomp_codec import nvcomp_module

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="bfloat16", chunk_tokens=64)  # 64 KiB


@pytest.fixture(scope="module")
def kv() -> torch.Tensor:
    return model_chunk(LAYOUT, seed=1)


@pytest.mark.parametrize("name", ["blosc-lz4", "blosc-zstd"])
@pytest.mark.parametrize("shuffle", ["bit", "byte", "none"])
def test_blosc_round_trip_on_model_kv_is_byte_identical(kv: torch.Tensor, name: str, shuffle: str) -> None:
    codec = make_codec(name, shuffle=shuffle, threads=2)
    payload = codec.encode(kv, LAYOUT)
    assert payload.numel() <= codec.max_encoded_bytes(LAYOUT.chunk_bytes)
    out = torch.empty_like(kv)
    codec_by_id(codec.codec_id).decode_into(payload, out, LAYOUT)  # the reader knows only the id
    assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))


def test_bitshuffle_shrinks_model_kv_more_than_no_shuffle(kv: torch.Tensor) -> None:
    sizes = {s: make_codec("blosc-zstd", shuffle=s).encode(kv, LAYOUT).numel() for s in ("bit", "none")}
    assert sizes["bit"] < sizes["none"] <= LAYOUT.chunk_bytes + 64


def test_blosc_decodes_into_a_strided_view(kv: torch.Tensor) -> None:
    codec = make_codec("blosc-lz4")
    big = torch.zeros((*LAYOUT.chunk_shape[:-1], 2 * LAYOUT.head_dim), dtype=LAYOUT.torch_dtype)
    view = big[..., : LAYOUT.head_dim]
    codec.decode_into(codec.encode(kv, LAYOUT), view, LAYOUT)
    assert torch.equal(view, kv) and not big[..., LAYOUT.head_dim:].any()


def test_bad_blosc_options_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="shuffle 'bits' is not one of bit, byte, none"):
        make_codec("blosc-lz4", shuffle="bits")
    with pytest.raises(ConfigError, match="level must be 0..9"):
        make_codec("blosc-zstd", level=12)
    with pytest.raises(ConfigError, match="block_bytes >= 0"):
        make_codec("blosc-zstd", block_bytes=-1)


@pytest.mark.parametrize("options", [{"block_bytes": 0}, {"block_bytes": 1 << 14, "level": 3, "shuffle": "byte"}])
def test_blosc_zstd_payloads_of_other_settings_decode_with_todays_defaults(kv: torch.Tensor, options: Any) -> None:
    """Chunks written before blosc-zstd's default block size became 1 MiB (block_bytes=0 was the default)."""
    old = make_codec("blosc-zstd", **options).encode(kv, LAYOUT)
    new = make_codec("blosc-zstd").encode(kv, LAYOUT)
    assert not torch.equal(old, new)  # the settings really differ on disk
    out = torch.empty_like(kv)
    codec_by_id(5).decode_into(old, out, LAYOUT)
    assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_lossy_codecs_give_the_same_bytes_on_one_thread_and_many(name: str) -> None:
    layout = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype="bfloat16", chunk_tokens=1040)  # 4+ blocks
    kv = (torch.randn(layout.chunk_shape, generator=torch.Generator().manual_seed(3)) * 3).to(layout.torch_dtype)
    one, many = make_codec(name, threads=1), make_codec(name, threads=3)
    payload = one.encode(kv, layout)
    assert torch.equal(payload, many.encode(kv, layout))
    out_one, out_many = torch.empty_like(kv), torch.empty_like(kv)
    one.decode_into(payload, out_one, layout)
    many.decode_into(payload, out_many, layout)
    assert torch.equal(out_one, out_many)
    error = (out_one.float() - kv.float()).abs().max() / kv.float().abs().max()
    assert 0 < error < (1 / 127 if name == "int8" else 1 / 8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_nvcomp_codec_falls_back_to_blosc_without_cuda(kv: torch.Tensor, caplog: pytest.LogCaptureFixture) -> None:
    nvcomp_module.cache_clear()
    with caplog.at_level(logging.INFO, logger="policies.compression.nvcomp_codec"):
        payload = make_codec("nvcomp-lz4").encode(kv, LAYOUT)
    assert "blosc2 CPU path" in caplog.text
    assert int(payload[0]) == 0  # mode 0: a blosc-lz4 body
    out = torch.empty_like(kv)
    make_codec("nvcomp-lz4").decode_into(payload, out, LAYOUT)
    assert torch.equal(out, kv)
    gpu_payload = payload.clone()
    gpu_payload[0] = 1  # as a GPU node would have written it
    with pytest.raises(TierIOError, match="nvidia-nvcomp-cu12"):
        make_codec("nvcomp-lz4").decode_into(gpu_payload, out, LAYOUT)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvcomp_gpu_path_round_trips_on_the_device(kv: torch.Tensor) -> None:
    pytest.importorskip("nvidia.nvcomp", reason="needs nvidia-nvcomp-cu12 (pip install 'kvstore[nvcomp]')")
    nvcomp_module.cache_clear()
    codec = make_codec("nvcomp-lz4")
    payload = codec.encode(kv.cuda(), LAYOUT)
    assert int(payload[0]) == 1 and payload.numel() < LAYOUT.chunk_bytes  # compressed by nvCOMP
    out = torch.empty_like(kv, device="cuda")
    codec.decode_into(payload, out, LAYOUT)
    assert torch.equal(out.cpu(), kv)
