"""SlotAllocator: first fit, alignment, coalescing of neighbouring holes."""

import random

from tiers.allocator import SlotAllocator


def test_allocate_free_coalesce() -> None:
    alloc = SlotAllocator(4096, align=256)
    a, b, c = alloc.allocate(1000), alloc.allocate(1024), alloc.allocate(2000)
    assert (a, b, c) == (0, 1024, 2048) and alloc.used_bytes == 4096
    assert alloc.allocate(1) is None
    alloc.free(a)  # type: ignore[arg-type]
    alloc.free(b)  # type: ignore[arg-type]  # merges with the hole before it
    assert alloc.largest_hole() == 2048
    alloc.free(c)  # type: ignore[arg-type]  # merges all three
    assert alloc.largest_hole() == 4096 and alloc.used_bytes == 0


def test_random_workload_never_overlaps() -> None:
    rng = random.Random(0)
    alloc = SlotAllocator(1 << 20, align=256)
    live: dict[int, int] = {}
    for _ in range(5000):
        if live and rng.random() < 0.45:
            offset = rng.choice(list(live))
            alloc.free(offset)
            del live[offset]
        else:
            size = rng.randint(1, 40_000)
            offset = alloc.allocate(size)  # type: ignore[assignment]
            if offset is not None:
                live[offset] = alloc.rounded(size)
        spans = sorted(live.items())
        assert all(o1 + s1 <= o2 for (o1, s1), (o2, _) in zip(spans, spans[1:]))
        assert alloc.used_bytes == sum(live.values())
    for offset in list(live):
        alloc.free(offset)
    assert alloc.largest_hole() == alloc.capacity_bytes
