"""Per KV-cache-group chunk selection: which blocks a chunk boundary needs for full, sliding-window and state groups.

vLLM's hybrid KV cache manager gives each group of layers its own block table. A prefix hit at a chunk
boundary `b` (tokens [0, b) served from the store) needs, per group:

- full attention: every block of [0, b) (the prefix chunks, as for a plain model);
- sliding window `w`: only the blocks holding tokens [b - (w - 1), b), which the next token attends to.
  A window that fits in a chunk is stored as those blocks at each boundary (bytes per token follow the
  window, not the prefix); a window wider than a chunk is stored as each chunk's own blocks, and a hit
  needs only the chunks that overlap the window (bytes per token as full attention, loads follow the window);
- state (Mamba, gated delta net): the recurrent state after token b - 1, one page per boundary.

A boundary is served only when every group has its piece there: full attention needs all chunks up to
`b`, the others need just the piece at `b`. Pure arithmetic, no vLLM import (connector.vllm.groups maps
vLLM's KVCacheConfig onto `GroupShape`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvstore.errors import ConfigError
from kvstore.kv_scope import named_key
from kvstore.layout import AttentionKind, KVLayout


class GroupKind(enum.Enum):
    FULL = "full"
    SLIDING = "sliding"
    STATE = "state"


@dataclass(frozen=True, slots=True)
class GroupShape:
    """One vLLM KV cache group as kvstore stores it.

    Args:
        kind: how a boundary selects its blocks.
        block_size: tokens per block of this group (vLLM's spec.block_size).
        page_bytes: bytes of one block of one layer (vLLM's spec.page_size_bytes; a state's whole page).
        num_layers: the layers in the group.
        window: the sliding window in tokens (SLIDING only).
    """

    kind: GroupKind
    block_size: int
    page_bytes: int
    num_layers: int
    window: int = 0

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.page_bytes <= 0 or self.num_layers <= 0:
            raise ConfigError(f"a KV cache group needs a positive block size, page size and layer count, got {self}")
        if (self.kind is GroupKind.SLIDING) != (self.window > 0):
            raise ConfigError(f"a sliding-window group needs its window (> 0) and no other group has one, got {self}")

    def scope_tag(self, index: int) -> str:
        """What sets this group's chunks apart from the other groups' under one model scope (vLLM may cut
        layers of one kind into several groups, each with its own block table: the index keeps them apart)."""
        return f"group{index}/{self.kind.value}/w{self.window}/b{self.block_size}/l{self.num_layers}"


    @property
    def max_blocks(self) -> int:
        """The most blocks a boundary needs in a sliding-window or state group."""
        if self.kind is GroupKind.SLIDING:
            return -(-(self.window - 1) // self.block_size) + 1  # +1: the window may start inside a block
        return 1

    def per_boundary(self, chunk_tokens: int) -> bool:
        """Whether this group stores one piece per boundary (state, a window within a chunk) rather than each
        chunk's own blocks (full attention, a window wider than a chunk)."""
        return self.kind is GroupKind.STATE or (self.kind is GroupKind.SLIDING
                                                 and self.max_blocks * self.block_size <= chunk_tokens)


def group_layout(shape: GroupShape, attention: KVLayout) -> KVLayout:
    """The chunk layout the store registers for one group (one registered layout per group shape).

    `attention` is the model's attention geometry (KV heads, head size, dtype) at the connector's chunk size.
    Full attention and a window wider than a chunk: the group's layers at that chunk size. A window within a
    chunk: the group's layers over the most window blocks a boundary needs (a shorter prefix's piece leaves
    the rest unused). State: one opaque page of vLLM's state bytes per layer, stored as int8 in one plane.
    """
    if shape.kind is GroupKind.STATE:
        return KVLayout(num_layers=shape.num_layers, num_kv_heads=1, head_dim=shape.page_bytes, dtype="int8",
                        chunk_tokens=1, kind=AttentionKind.MLA)
    if shape.per_boundary(attention.chunk_tokens):
        return replace(attention, num_layers=shape.num_layers, chunk_tokens=shape.max_blocks * shape.block_size)
    return replace(attention, num_layers=shape.num_layers)


def group_keys(keys: Sequence[bytes], shape: GroupShape, index: int, layout: KVLayout) -> list[bytes]:
    """A group's keys for the chunks the model-scoped `keys` name: each under the group's own scope (its
    tag and its layout's fingerprint), so two groups' pieces for the same tokens never share a key."""
    tag = f"{shape.scope_tag(index)}/{layout.fingerprint:016x}"
    return [named_key(key, tag) for key in keys]


def boundary_blocks(shape: GroupShape, boundary: int) -> range:
    """The block indices (in the request's block table of this group) the next token after `boundary` needs."""
    if boundary <= 0:
        raise ConfigError(f"a chunk boundary is a positive token count, got {boundary}")
    last = -(-boundary // shape.block_size)  # one past the block holding token boundary - 1
    if shape.kind is GroupKind.FULL:
        return range(0, last)
    if shape.kind is GroupKind.STATE:
        if boundary % shape.block_size:
            raise ConfigError(f"a state is kept at block ends; boundary {boundary} is not a multiple of the "
                              f"group's block size {shape.block_size}: set chunk_tokens to a multiple of it")
        return range(last - 1, last)
    first_token = max(0, boundary - (shape.window - 1))
    return range(first_token // shape.block_size, last)


def chunk_blocks(shape: GroupShape, start: int, end: int) -> range:
    """The blocks a group stores for the chunk [start, end): the chunk's own blocks, or the blocks the
    boundary `end` needs for a group stored per boundary."""
    if shape.per_boundary(end - start):
        return boundary_blocks(shape, end)
    return range(start // shape.block_size, -(-end // shape.block_size))


def chunk_bytes(shape: GroupShape, start: int, end: int) -> int:
    """Bytes this group stores for the chunk [start, end) (every layer of the group)."""
    return len(chunk_blocks(shape, start, end)) * shape.page_bytes * shape.num_layers


def bytes_per_token(shapes: Sequence[GroupShape], chunk_tokens: int, prefix_tokens: int) -> float:
    """Mean bytes stored per prompt token for a `prefix_tokens` prompt cut into `chunk_tokens` chunks."""
    ends = range(chunk_tokens, prefix_tokens + 1, chunk_tokens)
    total = sum(chunk_bytes(s, end - chunk_tokens, end) for s in shapes for end in ends)
    return total / max(1, len(ends) * chunk_tokens)


def needed_boundaries(shape: GroupShape, boundary: int, chunk_tokens: int) -> range:
    """The chunk ends whose pieces of this group a hit at `boundary` loads."""
    if shape.per_boundary(chunk_tokens):
        return range(boundary, boundary + 1)
    first = chunk_tokens
    if shape.kind is GroupKind.SLIDING:  # the chunks overlapping [boundary - (window - 1), boundary)
        first = max(chunk_tokens, (boundary - (shape.window - 1)) // chunk_tokens * chunk_tokens + chunk_tokens)
    return range(first, boundary + 1, chunk_tokens)


def served_boundary(shapes: Sequence[GroupShape], chunk_tokens: int, last: int,
                    present: Callable[[int, int], bool]) -> int:
    """The longest prefix (a chunk boundary up to `last`, or 0) that every group can serve.

    `present(group_index, boundary)` says whether that group's piece at that chunk end is in the store.
    Full attention needs its chunks at every boundary up to the hit, the other groups only those their
    window or state at the hit needs; a full-attention miss ends the search.
    """
    best = 0
    for end in range(chunk_tokens, last + 1, chunk_tokens):
        if not all(present(i, end) for i, s in enumerate(shapes) if s.kind is GroupKind.FULL):
            break
        if all(present(i, e) for i, s in enumerate(shapes) if s.kind is not GroupKind.FULL
               for e in needed_boundaries(s, end, chunk_tokens)):
            best = end
    return best


NULL_BLOCK_ID = 0  # vLLM's null block (BlockPool.null_block, the first block it pops): a slot it freed or skipped


def group_block_ids(shapes: Sequence[GroupShape], block_ids: Sequence[Sequence[int]], start: int,
                    end: int) -> list[list[int]] | None:
    """Per group, the vLLM block ids the chunk [start, end) is copied from or into, from the per-group block
    tables vLLM's hooks hand over; None when a group's needed block is gone (vLLM's null block: freed out of
    the window or skipped), so that chunk cannot be saved from, or loaded into, this request."""
    if len(shapes) != len(block_ids):
        raise ConfigError(f"vLLM handed block ids for {len(block_ids)} KV cache groups; the connector knows "
                          f"{len(shapes)}")
    picked: list[list[int]] = []
    for shape, table in zip(shapes, block_ids, strict=True):
        blocks = chunk_blocks(shape, start, end)
        if blocks.stop > len(table):
            return None
        ids = [table[b] for b in blocks]
        if NULL_BLOCK_ID in ids:
            return None
        picked.append(ids)
    return picked
