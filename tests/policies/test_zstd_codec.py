"""The `zstd` codec (Zstandard on the top byte plane): byte-identical round trips on the engine model's KV
and every supported dtype, a better ratio than blosc-zstd, raw planes for incompressible bytes, the same
payload on any thread count, the numpy path equal to the numba one, and corrupt payloads named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.kv_model import model_chunk
from kvstore.chunk_format import aligned_empty
from kvstore.errors import ConfigError, CorruptChunkError
from kvstore.layout import KVLayout
from policies.compression import codec_by_id, make_codec, planes, zstd_planes
from policies.compression.base import BufferEncoder
from policies.compression.registry import writer_codec_name

LAYOUT = KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, dtype="bfloat16", chunk_tokens=256)  # 1 MiB
ODD = KVLayout(num_layers=3, num_kv_heads=3, head_dim=40, dtype="bfloat16", chunk_tokens=2200)  # 2.2 MiB: 3 pieces


@pytest.fixture(scope="module")
def kv() -> torch.Tensor:
    return model_chunk(LAYOUT, seed=1)


def _round_trip(chunk: torch.Tensor, layout: KVLayout, threads: int = 2) -> torch.Tensor:
    codec = make_codec("zstd", threads=threads)
    payload = codec.encode(chunk, layout)
    assert payload.numel() <= codec.max_encoded_bytes(layout.chunk_bytes)
    assert payload.data_ptr() % 4096 == 0  # an O_DIRECT tier writes it in place
    out = torch.empty_like(chunk)
    codec_by_id(7).decode_into(payload, out, layout)  # the reader knows only the id
    assert torch.equal(out.view(torch.uint8), chunk.view(torch.uint8))
    return payload


def test_model_kv_round_trips_and_shrinks_more_than_blosc_zstd(kv: torch.Tensor) -> None:
    payload = _round_trip(kv, LAYOUT)
    blosc = make_codec("blosc-zstd").encode(kv, LAYOUT)
    assert payload.numel() < blosc.numel() < LAYOUT.chunk_bytes


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e4m3fn", "int8"])
def test_every_dtype_round_trips_over_several_pieces(dtype: str) -> None:
    layout = ODD.with_dtype(dtype)
    values = torch.randn(layout.chunk_shape, generator=torch.Generator().manual_seed(2)) * 4
    chunk = values.to(torch.int8) if dtype == "int8" else values.to(layout.torch_dtype)
    assert layout.chunk_bytes > zstd_planes.PIECE_BYTES  # several pieces, the last one short
    _round_trip(chunk, layout)


def test_incompressible_bytes_are_stored_raw_within_the_bound() -> None:
    noise = torch.randint(0, 256, (LAYOUT.chunk_bytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    chunk = noise.view(LAYOUT.torch_dtype).reshape(LAYOUT.chunk_shape)
    payload = _round_trip(chunk, LAYOUT)
    header = zstd_planes._HEADER.itemsize + zstd_planes._ENTRY.itemsize
    assert payload.numel() == LAYOUT.chunk_bytes + header  # one piece, both planes raw


def test_compressible_mantissas_are_coded_too() -> None:
    """An all-ones chunk (padding, a constant): the rest planes shrink as well, so they are coded."""
    chunk = torch.ones(LAYOUT.chunk_shape, dtype=torch.float32)
    layout = LAYOUT.with_dtype("float32")
    payload = _round_trip(chunk, layout)
    assert payload.numel() < layout.chunk_bytes // 100


def test_one_thread_and_many_write_the_same_payload() -> None:
    chunk = model_chunk(ODD, seed=2)
    one, many = make_codec("zstd", threads=1).encode(chunk, ODD), make_codec("zstd", threads=3).encode(chunk, ODD)
    assert torch.equal(one, many)


def test_encode_into_a_reused_buffer_writes_the_same_payload_in_it() -> None:
    """A store's writer thread encodes every chunk into one buffer (levels.py): same bytes as `encode`,
    a view of the buffer; a buffer below the bound is refused with the size it needs."""
    codec = make_codec("zstd", threads=2)
    assert isinstance(codec, BufferEncoder)
    buffer = aligned_empty(codec.max_encoded_bytes(ODD.chunk_bytes))
    for seed in (2, 3):
        chunk = model_chunk(ODD, seed=seed)
        payload = codec.encode_into(chunk, ODD, buffer)
        assert payload.data_ptr() == buffer.data_ptr()
        assert torch.equal(payload, codec.encode(chunk, ODD))
    with pytest.raises(ConfigError, match=str(codec.max_encoded_bytes(ODD.chunk_bytes))):
        codec.encode_into(chunk, ODD, buffer[:100])


@pytest.mark.parametrize("itemsize", [1, 2, 4])
def test_the_numpy_plane_path_matches_the_numba_kernels(itemsize: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without numba (a missing package, simulated) planes.py splits with numpy: same planes, same merge."""
    src = np.random.default_rng(itemsize).integers(0, 256, 1000 * itemsize, dtype=np.uint8)

    def run() -> tuple[np.ndarray, ...]:
        top, rest, back = np.empty(1000, np.uint8), np.empty(1000 * (itemsize - 1), np.uint8), np.empty_like(src)
        planes.top_only(src, itemsize, top)
        if itemsize > 1:
            planes.rest_only(src, itemsize, rest)
        planes.merge(top, rest, itemsize, back)
        return top, rest, back

    assert planes._kernels() is not None  # numba is a dependency
    fast = run()
    monkeypatch.setattr(planes, "_kernels", lambda: None)
    slow = run()
    values = src.reshape(-1, itemsize)
    assert np.array_equal(fast[0], values[:, -1])  # top = each value's last (most significant) byte
    if itemsize > 1:
        assert np.array_equal(fast[1].reshape(-1, itemsize - 1), values[:, :-1])
    assert np.array_equal(fast[2], src)
    for a, b in zip(fast, slow, strict=True):
        assert np.array_equal(a, b)


def test_blosc_zstd_is_retired_for_writing_and_still_reads(kv: torch.Tensor) -> None:
    assert writer_codec_name("blosc-zstd", "nvme") == "zstd"
    old = make_codec("blosc-zstd").encode(kv, LAYOUT)  # what a tier wrote before
    out = torch.empty_like(kv)
    codec_by_id(5).decode_into(old, out, LAYOUT)
    assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))


def _corrupt(payload: torch.Tensor, at: int, value: int) -> torch.Tensor:
    bad = payload.clone()
    bad[at] = value
    return bad


def test_corrupt_payloads_raise_corrupt_chunk_errors_that_name_the_problem(kv: torch.Tensor) -> None:
    codec = make_codec("zstd")
    payload = codec.encode(kv, LAYOUT)
    out = torch.empty_like(kv)
    head = zstd_planes._HEADER.itemsize + zstd_planes._ENTRY.itemsize
    cases = [(payload[:10], "shorter than its 20-byte header"),
             (payload[:-1], "its table says"),
             (_corrupt(payload, 0, 9), "does not match version 1"),
             (_corrupt(payload, head + 4, 0xFF), "does not decompress|decompressed to"),  # inside the top frame
             (_corrupt(payload, zstd_planes._HEADER.itemsize, 0xFF), "table says|raw plane holds|decompress")]
    for bad, message in cases:
        with pytest.raises(CorruptChunkError, match=message):
            codec.decode_into(bad, out, LAYOUT)
    with pytest.raises(CorruptChunkError, match="layout"):
        codec.decode_into(payload, torch.empty(ODD.chunk_shape, dtype=torch.bfloat16), ODD)


def test_bad_options_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="threads must be >= 0"):
        make_codec("zstd", threads=-1)
    with pytest.raises(ConfigError, match="min_match 3..7"):
        make_codec("zstd", min_match=2)


def test_other_zstd_settings_decode_with_the_default_codec(kv: torch.Tensor) -> None:
    """Encoder settings live in the zstd frames, so a chunk written with any of them reads back."""
    other = make_codec("zstd", window_log=19, hash_log=12, min_match=4).encode(kv, LAYOUT)
    assert not torch.equal(other, make_codec("zstd").encode(kv, LAYOUT))
    out = torch.empty_like(kv)
    make_codec("zstd").decode_into(other, out, LAYOUT)
    assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))


def test_decodes_into_a_strided_view(kv: torch.Tensor) -> None:
    codec = make_codec("zstd")
    big = torch.zeros((*LAYOUT.chunk_shape[:-1], 2 * LAYOUT.head_dim), dtype=LAYOUT.torch_dtype)
    view = big[..., : LAYOUT.head_dim]
    codec.decode_into(codec.encode(kv, LAYOUT), view, LAYOUT)
    assert torch.equal(view, kv) and not big[..., LAYOUT.head_dim :].any()
