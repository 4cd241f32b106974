"""BlockPool: exact block ids, reference counts, free-queue eviction order and prefix reuse."""

from __future__ import annotations

import pytest

from connector.engine.block_pool import BlockPool, NoFreeBlocksError
from kvstore.errors import KVStoreError


def test_allocate_takes_lowest_free_ids_first_and_free_returns_tail_first() -> None:
    pool = BlockPool(6, 4)
    assert pool.allocate(3) == [0, 1, 2]
    pool.free([0, 1, 2])  # tail first: 2, 1, 0 join the right end of the queue
    assert list(pool.free_queue) == [3, 4, 5, 2, 1, 0]
    assert pool.allocate(4) == [3, 4, 5, 2]


def test_freed_cached_pages_are_reusable_until_evicted() -> None:
    pool = BlockPool(4, 4)
    a = pool.allocate(2)
    pool.cache_block(a[0], b"h0")
    pool.cache_block(a[1], b"h1")
    pool.free(a)
    assert pool.find_cached_prefix([b"h0", b"h1", b"h2"]) == [0, 1]
    assert pool.can_allocate(2, reused=[0, 1]) and not pool.can_allocate(3, reused=[0, 1])
    pool.touch([0, 1])  # a new request takes the cached pages back out of the free queue
    assert pool.ref_counts[:2] == [1, 1] and pool.num_free_blocks == 2
    pool.free([0, 1])
    pool.allocate(3)  # the queue is [2, 3, 1, 0]: block 1 (the chain's tail) is evicted before 0
    assert pool.find_cached_prefix([b"h0", b"h1"]) == [0]


def test_shared_page_survives_until_its_last_reference() -> None:
    pool = BlockPool(2, 4)
    (b,) = pool.allocate(1)
    pool.touch([b])
    pool.free([b])
    assert pool.ref_counts[b] == 1 and b not in pool.free_queue
    pool.free([b])
    assert b in pool.free_queue
    with pytest.raises(KVStoreError, match="double free"):
        pool.free([b])


def test_over_allocation_raises_with_the_numbers() -> None:
    pool = BlockPool(2, 4)
    with pytest.raises(NoFreeBlocksError, match="3 pages but 2 are free"):
        pool.allocate(3)
