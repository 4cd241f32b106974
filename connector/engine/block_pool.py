"""`BlockPool`: fixed-size KV pages with reference counts, an LRU free queue and prefix reuse by page hash.

    free queue (ref_count == 0), evicted from the left:
        [ oldest-freed ... newest-freed ]
    A freed page keeps its hash and stays reusable by a later prompt with the same prefix until
    `allocate` takes it from the left of the queue (its hash is then forgotten). Sequences free
    their pages tail first, so a prompt's last pages are reallocated before its first ones.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvstore.errors import ConfigError, KVStoreError

logger = logging.getLogger(__name__)


class NoFreeBlocksError(KVStoreError):
    """`allocate` was asked for more pages than are free; the scheduler should check `can_allocate` first."""


class BlockPool:
    """Mechanism only: which page is free, who holds it, which prefix hash it caches."""

    def __init__(self, num_blocks: int, page_size: int) -> None:
        if num_blocks < 1 or page_size < 1:
            raise ConfigError(f"num_blocks and page_size must be >= 1, got {num_blocks}, {page_size}")
        self.num_blocks = num_blocks
        self.page_size = page_size
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def find_cached_prefix(self, page_hashes: Sequence[bytes]) -> list[int]:
        """Block ids of the leading pages whose hash is cached (no side effects)."""
        hits: list[int] = []
        for page_hash in page_hashes:
            block = self.hash_to_block.get(page_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_allocate(self, num_new_blocks: int, reused: Iterable[int] = ()) -> bool:
        """Whether `num_new_blocks` fresh pages fit after `reused` cached pages leave the free queue."""
        num_reused_free = sum(1 for b in set(reused) if self.ref_counts[b] == 0)
        return self.num_free_blocks - num_reused_free >= num_new_blocks

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference on cached pages (pulling free ones out of the free queue)."""
        for b in block_ids:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]
            self.ref_counts[b] += 1

    def allocate(self, num_blocks: int) -> list[int]:
        """`num_blocks` pages with ref count 1, evicting the least recently freed cached pages."""
        if num_blocks > self.num_free_blocks:
            raise NoFreeBlocksError(f"asked for {num_blocks} pages but {self.num_free_blocks} are free; check can_allocate")
        blocks = []
        for _ in range(num_blocks):
            b, _ = self.free_queue.popitem(last=False)
            old = self.block_hashes[b]
            if old is not None:
                if self.hash_to_block.get(old) == b:
                    del self.hash_to_block[old]
                self.block_hashes[b] = None
            self.ref_counts[b] = 1
            blocks.append(b)
        return blocks

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference per page, tail first; pages reaching 0 join the free queue's right end."""
        for b in reversed(block_ids):
            if self.ref_counts[b] <= 0:
                raise KVStoreError(f"block {b} freed with ref count {self.ref_counts[b]}: double free")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue[b] = None

    def cache_block(self, block_id: int, page_hash: bytes) -> None:
        """Register a full, computed page under its prefix hash (first writer wins)."""
        if self.block_hashes[block_id] is not None:
            return
        if page_hash in self.hash_to_block:
            return
        self.block_hashes[block_id] = page_hash
        self.hash_to_block[page_hash] = block_id
