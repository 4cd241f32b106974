"""SlotAllocator: first fit, alignment, coalescing of neighbouring holes."""

import random

import pytest

from tiers.allocator import SlotAllocator


def test_allocate_free_coalesce() -> None:
    alloc = SlotAllocator(4096, align=256)
    a, b, c = alloc.allocate(1000), alloc.allocate(1024), alloc.allocate(2000)
    assert (a, b, c) == (0, 1024, 2048) and alloc.used_bytes == 4096
    assert alloc.allocate(1) is None
    alloc.free(a, 1000)  # type: ignore[arg-type]
    alloc.free(b, 1024)  # type: ignore[arg-type]  # merges with the hole before it
    assert alloc.largest_hole() == 2048
    alloc.free(c, 2000)  # type: ignore[arg-type]  # merges all three
    assert alloc.largest_hole() == 4096 and alloc.used_bytes == 0


def test_random_workload_never_overlaps() -> None:
    rng = random.Random(0)
    alloc = SlotAllocator(1 << 20, align=256)
    live: dict[int, int] = {}
    for _ in range(5000):
        if live and rng.random() < 0.45:
            offset = rng.choice(list(live))
            alloc.free(offset, live.pop(offset))
        else:
            size = rng.randint(1, 40_000)
            offset = alloc.allocate(size)  # type: ignore[assignment]
            if offset is not None:
                live[offset] = alloc.rounded(size)
        spans = sorted(live.items())
        assert all(o1 + s1 <= o2 for (o1, s1), (o2, _) in zip(spans, spans[1:]))
        assert alloc.used_bytes == sum(live.values())
    for offset, size in list(live.items()):
        alloc.free(offset, size)
    assert alloc.largest_hole() == alloc.capacity_bytes


def test_a_double_free_or_an_oversized_free_is_refused_and_changes_nothing() -> None:
    alloc = SlotAllocator(4096, align=256)
    assert (alloc.allocate(256), alloc.allocate(512)) == (0, 256)
    alloc.free(0, 256)
    for offset, nbytes in ((0, 256), (256, 4096), (256 + 128, 128)):  # freed already; past its slot; unaligned
        with pytest.raises(ValueError, match="not one allocated slot"):
            alloc.free(offset, nbytes)
    assert alloc.used_bytes == 512 and alloc.largest_hole() == 4096 - 768
    alloc.free(256, 512)
    assert alloc.used_bytes == 0 and alloc.largest_hole() == 4096
