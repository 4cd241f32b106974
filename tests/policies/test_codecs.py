"""Codecs: lossless ones round-trip byte-identical (Hypothesis); lossy ones stay within their bound."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.kv_synth import synthetic_chunk
from kvstore.errors import CorruptChunkError, LayoutMismatchError, UnknownNameError
from kvstore.layout import KVLayout
from policies.compression import Codec, codec_by_id, codec_names, make_codec

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="bfloat16", chunk_tokens=16)


def test_registry_ids_and_errors() -> None:
    assert codec_names() == ["none", "lz4", "int8", "fp8", "blosc-lz4", "blosc-zstd", "nvcomp-lz4", "zstd"]
    assert [codec_by_id(i).name for i in range(8)] == codec_names()
    assert all(isinstance(make_codec(n), Codec) for n in codec_names())
    assert [make_codec(n).lossless for n in codec_names()] == [True, True, False, False, True, True, True, True]
    with pytest.raises(UnknownNameError, match="valid: blosc-lz4, blosc-zstd, fp8, int8, lz4, none"):
        make_codec("brotli")
    with pytest.raises(UnknownNameError, match="lz4=1"):
        codec_by_id(9)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(["bfloat16", "float16", "float32"]), data=st.data())
@pytest.mark.parametrize("name", ["none", "lz4", "blosc-lz4", "blosc-zstd", "nvcomp-lz4", "zstd"])
def test_lossless_round_trip_is_byte_identical(name: str, dtype: str, data: st.DataObject) -> None:
    """Arbitrary bit patterns (NaNs, infinities, denormals, runs) come back bit for bit."""
    layout = LAYOUT.with_dtype(dtype)
    pattern = data.draw(st.sampled_from(["random", "runs", "zeros"]))
    seed = data.draw(st.integers(0, 2**31 - 1))
    raw = torch.randint(0, 256, (layout.chunk_bytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    if pattern == "runs":
        raw = raw[:: 64].repeat_interleave(64)[: layout.chunk_bytes]
    elif pattern == "zeros":
        raw = torch.zeros(layout.chunk_bytes, dtype=torch.uint8)
    chunk = raw.view(layout.torch_dtype).reshape(layout.chunk_shape)
    codec = make_codec(name)
    payload = codec.encode(chunk, layout)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() <= codec.max_encoded_bytes(layout.chunk_bytes)
    out = torch.empty(layout.chunk_shape, dtype=layout.torch_dtype)
    codec.decode_into(payload.clone(), out, layout)
    assert torch.equal(out.reshape(-1).view(torch.uint8), raw)


def test_lz4_shrinks_realistic_kv_and_decodes_into_a_strided_view() -> None:
    layout = KVLayout(num_layers=2, num_kv_heads=8, head_dim=128, dtype="bfloat16", chunk_tokens=64)  # 256 KiB
    chunk = synthetic_chunk(layout, seed=3)
    codec = make_codec("lz4")
    payload = codec.encode(chunk, layout)
    assert payload.numel() < layout.chunk_bytes * 0.95  # the shuffled high bytes compress
    big = torch.zeros((2, *layout.chunk_shape), dtype=layout.torch_dtype)
    codec.decode_into(payload, big[1], layout)
    assert torch.equal(big[1], chunk) and not big[0].any()


# Bounds from policies/compression/lossy.py's docstring, with the output dtype's rounding.
def _bound(name: str, x: torch.Tensor, decoded: torch.Tensor, eps: float) -> torch.Tensor:
    amax = x.abs().amax(dim=-1, keepdim=True)
    if name == "int8":
        return amax / 254 + eps * decoded.abs()
    return 2**-4 * x.abs() + amax / 448 * 2**-10 + eps * decoded.abs()


@pytest.mark.parametrize("name", ["int8", "fp8"])
@pytest.mark.parametrize("dtype,eps", [("bfloat16", 2**-8), ("float16", 2**-11), ("float32", 2**-24)])
@pytest.mark.parametrize("seed", [0, 1])
def test_lossy_codecs_stay_within_their_stated_bound(name: str, dtype: str, eps: float, seed: int) -> None:
    layout = LAYOUT.with_dtype(dtype)
    chunk = synthetic_chunk(layout, seed=seed)
    codec = make_codec(name)
    payload = codec.encode(chunk, layout)
    assert payload.numel() < layout.chunk_bytes * 0.6 or dtype == "float32"
    out = torch.empty_like(chunk)
    codec.decode_into(payload, out, layout)
    x, y = chunk.float(), out.float()
    assert ((y - x).abs() <= _bound(name, x, y, eps) * (1 + 1e-6)).all()


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_lossy_codecs_keep_zero_vectors_exact(name: str) -> None:
    chunk = torch.zeros(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
    out = torch.ones_like(chunk)
    make_codec(name).decode_into(make_codec(name).encode(chunk, LAYOUT), out, LAYOUT)
    assert not out.any()


@pytest.mark.parametrize("name", codec_names())
def test_damaged_or_foreign_payloads_raise_corrupt(name: str) -> None:
    codec = make_codec(name)
    payload = codec.encode(synthetic_chunk(LAYOUT), LAYOUT)
    out = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
    with pytest.raises(CorruptChunkError):
        codec.decode_into(payload[: payload.numel() // 2], out, LAYOUT)


def test_wrong_shape_is_a_layout_mismatch() -> None:
    with pytest.raises(LayoutMismatchError):
        make_codec("lz4").encode(torch.zeros(3, dtype=torch.bfloat16), LAYOUT)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", codec_names())
def test_codecs_encode_from_and_decode_into_cuda_tensors(name: str) -> None:
    chunk = synthetic_chunk(LAYOUT, seed=5)
    codec = make_codec(name)
    payload = codec.encode(chunk.cuda(), LAYOUT)
    out = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype, device="cuda")
    codec.decode_into(payload, out, LAYOUT)
    reference = torch.empty_like(chunk)
    codec.decode_into(codec.encode(chunk, LAYOUT), reference, LAYOUT)
    assert torch.equal(out.cpu(), reference)
