"""`copy_bytes`: slices claimed by a small pool between CPU tensors, the widest element type otherwise;
the same bytes either way, and nothing outside the range touched."""

from __future__ import annotations

import pytest
import torch

from kvstore.types import ChunkMeta
from tiers.byte_copy import SLICE_BYTES, copy_bytes, copy_many, widest_view_dtype
from tiers.file_io import aligned_empty
from tiers.host import HostTier


def _random_bytes(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("offset", "nbytes", "expected"), [
    (0, 4096, torch.int64), (4, 4096, torch.int32), (2, 4094, torch.int16), (1, 4095, torch.uint8),
    (0, 4100, torch.int32), (0, 4097, torch.uint8),
])
def test_widest_view_dtype_follows_address_and_length(offset: int, nbytes: int, expected: torch.dtype) -> None:
    base = aligned_empty(8192)
    assert widest_view_dtype(base[offset : offset + nbytes]) == expected


@pytest.mark.parametrize(("src_offset", "dst_offset", "nbytes"), [
    (0, 0, 1 << 20), (3, 5, 10_001), (4, 0, 4092), (2, 6, 6), (0, 0, 0),
    (0, 0, 3 * SLICE_BYTES), (1, 7, 2 * SLICE_BYTES + 12_345),  # several slices, the last a partial one
])
def test_copy_bytes_copies_exactly_the_range(src_offset: int, dst_offset: int, nbytes: int) -> None:
    src = _random_bytes(nbytes + 16)
    dst = torch.zeros(nbytes + 16, dtype=torch.uint8)
    copy_bytes(dst[dst_offset : dst_offset + nbytes], src[src_offset : src_offset + nbytes])
    assert torch.equal(dst[dst_offset : dst_offset + nbytes], src[src_offset : src_offset + nbytes])
    assert not dst[:dst_offset].any() and not dst[dst_offset + nbytes :].any()  # nothing outside the range


def test_copy_bytes_falls_back_for_strided_and_other_dtypes() -> None:
    src = _random_bytes(64)
    dst = torch.zeros(32, dtype=torch.uint8)
    copy_bytes(dst, src[::2])  # not contiguous: a plain copy_
    assert torch.equal(dst, src[::2])
    halves = torch.zeros(8, dtype=torch.float16)
    copy_bytes(halves, torch.arange(8, dtype=torch.float16))  # not bytes: a plain copy_
    assert torch.equal(halves, torch.arange(8, dtype=torch.float16))


def test_host_tier_round_trips_odd_sized_payloads() -> None:
    """The host tier's put and get go through copy_bytes: odd sizes and offsets must survive."""
    tier = HostTier(capacity_bytes=1 << 20, pin=False, prefault=False)
    try:
        for i, nbytes in enumerate((1, 7, 4096, 65_539)):
            payload = _random_bytes(nbytes, seed=i)
            key = bytes([i]) * 16
            tier.put(key, payload, ChunkMeta(codec_id=0, raw_bytes=nbytes, stored_bytes=nbytes, layout_fingerprint=1))
            out = torch.zeros(nbytes + 3, dtype=torch.uint8)
            assert tier.get_into(key, out[3:]) == nbytes
            assert torch.equal(out[3:], payload) and not out[:3].any()
    finally:
        tier.close()


def test_copy_bytes_in_inference_mode_and_from_many_threads() -> None:
    """Engines copy under torch.inference_mode, and the store's readers copy at once: slices of
    concurrent copies share one helper pool and each copy still gets exactly its own bytes."""
    from concurrent.futures import ThreadPoolExecutor

    sources = [_random_bytes(2 * SLICE_BYTES + 100, seed=i) for i in range(4)]
    with torch.inference_mode():
        targets = [torch.zeros_like(s) for s in sources]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda pair: copy_bytes(*pair), zip(targets, sources, strict=True)))
    assert all(torch.equal(t, s) for t, s in zip(targets, sources, strict=True))


def _pairs(sizes: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    srcs = [_random_bytes(n, seed=i) for i, n in enumerate(sizes)]
    return [torch.zeros(n, dtype=torch.uint8) for n in sizes], srcs


@pytest.mark.parametrize("sizes", [
    [], [5 * SLICE_BYTES + 3],  # no pair; one pair (sliced by copy_bytes)
    [SLICE_BYTES] * 6, [2 * SLICE_BYTES, 7, 0, SLICE_BYTES + 1, 4096],  # whole pairs of mixed sizes
    [6 * SLICE_BYTES, 4096, 65_539],  # one large pair beside small ones
    [1, 7, 4096],  # less than a slice in all: no helper
])
def test_copy_many_copies_every_pair_exactly(sizes: list[int]) -> None:
    dsts, srcs = _pairs(sizes)
    copy_many(dsts, srcs)
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs, strict=True))


def test_copy_many_falls_back_per_pair_for_strided_and_other_dtypes() -> None:
    dsts, srcs = _pairs([SLICE_BYTES, SLICE_BYTES + 5])
    strided_src = _random_bytes(64, seed=9)
    halves = torch.zeros(8, dtype=torch.float16)
    copy_many([*dsts, torch.zeros(32, dtype=torch.uint8), halves],
              [*srcs, strided_src[::2], torch.arange(8, dtype=torch.float16)])
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs, strict=True))
    assert torch.equal(halves, torch.arange(8, dtype=torch.float16))


def test_copy_many_rejects_unequal_lists() -> None:
    dsts, _ = _pairs([4, 4])
    with pytest.raises(ValueError, match="2 destinations but 1 sources"):
        copy_many(dsts, [_random_bytes(4)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copy_many_copies_to_and_from_a_device() -> None:
    dsts, srcs = _pairs([SLICE_BYTES, 4096])
    on_device = [torch.zeros_like(s, device="cuda") for s in srcs]
    copy_many(on_device, srcs)
    copy_many(dsts, on_device)
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs, strict=True))
