"""Per-group block selection for vLLM's hybrid KV cache manager (connector.vllm.window)."""

from __future__ import annotations

import pytest

from connector.vllm.window import (
    GroupKind,
    GroupShape,
    boundary_blocks,
    bytes_per_token,
    chunk_blocks,
    needed_boundaries,
    served_boundary,
)
from kvstore.errors import ConfigError

FULL = GroupShape(GroupKind.FULL, block_size=16, page_bytes=1000, num_layers=1)
SLIDE = GroupShape(GroupKind.SLIDING, block_size=16, page_bytes=1000, num_layers=5, window=64)
STATE = GroupShape(GroupKind.STATE, block_size=64, page_bytes=7000, num_layers=3)


def test_full_attention_needs_the_whole_prefix() -> None:
    assert boundary_blocks(FULL, 256) == range(0, 16)
    assert chunk_blocks(FULL, 128, 256) == range(8, 16)


def test_sliding_window_keeps_only_the_window_before_the_boundary() -> None:
    # window 64: the next token (256) attends to tokens 193..255, blocks 12..15 (12 holds 192..207)
    assert boundary_blocks(SLIDE, 256) == range(12, 16)
    # a chunk stores the boundary's window, whatever the chunk's start
    assert chunk_blocks(SLIDE, 0, 256) == chunk_blocks(SLIDE, 192, 256)
    # a prefix shorter than the window keeps what there is
    assert boundary_blocks(SLIDE, 32) == range(0, 2)


@pytest.mark.parametrize("window,boundary", [(2, 16), (17, 32), (4096, 256), (33, 80)])
def test_window_blocks_cover_exactly_the_attended_tokens(window: int, boundary: int) -> None:
    shape = GroupShape(GroupKind.SLIDING, 16, 1, 1, window=window)
    blocks = boundary_blocks(shape, boundary)
    tokens = {t for b in blocks for t in range(b * 16, (b + 1) * 16)}
    attended = set(range(max(0, boundary - (window - 1)), boundary))
    assert attended <= tokens
    assert min(tokens) > min(attended) - 16  # no whole block more than the window needs


def test_state_is_the_block_that_ends_at_the_boundary() -> None:
    assert boundary_blocks(STATE, 256) == range(3, 4)
    with pytest.raises(ConfigError, match="multiple of the group's block size 64"):
        boundary_blocks(STATE, 96)


def test_bytes_per_token_follow_the_window_not_the_prefix() -> None:
    # Gemma-3's shape: 5 sliding layers to 1 full; the full conversion stores all 6 layers for every token
    converted = GroupShape(GroupKind.FULL, 16, 1000, 6)
    hybrid = [FULL, SLIDE]
    full_bpt = bytes_per_token([converted], 256, 4096)
    hybrid_bpt = bytes_per_token(hybrid, 256, 4096)
    assert full_bpt == 6000 / 16
    # per 256-token chunk: 16 full blocks + 4 window blocks x 5 layers
    assert hybrid_bpt == (16 * 1000 + 4 * 1000 * 5) / 256
    assert hybrid_bpt < full_bpt / 2


def test_a_hit_needs_every_group_at_its_boundary() -> None:
    shapes = [FULL, SLIDE, STATE]
    stored = {(0, 256), (0, 512), (0, 768), (1, 256), (2, 256), (1, 768), (2, 768), (2, 512)}
    present = lambda g, end: (g, end) in stored  # noqa: E731
    # 768: full attention has every chunk, the window and the state are there too
    assert served_boundary(shapes, 256, 1024, present) == 768
    stored.discard((2, 768))  # no state at 768: the hit falls back to 256 (512 lacks the window)
    assert served_boundary(shapes, 256, 1024, present) == 256
    stored.discard((0, 256))  # a full-attention hole ends the prefix
    assert served_boundary(shapes, 256, 768, present) == 0


def test_a_window_wider_than_a_chunk_keeps_each_chunk_and_loads_only_the_window() -> None:
    wide = GroupShape(GroupKind.SLIDING, 16, 1000, 5, window=600)
    assert not wide.per_boundary(256) and SLIDE.per_boundary(256)
    assert chunk_blocks(wide, 256, 512) == range(16, 32)  # the chunk's own blocks: no byte stored twice
    # a hit at 1024 attends to tokens 425..1023: the chunks ending at 512 (256..511), 768 and 1024
    assert needed_boundaries(wide, 1024, 256) == range(512, 1025, 256)
    assert needed_boundaries(FULL, 1024, 256) == range(256, 1025, 256)
    stored = {(0, e) for e in (256, 512, 768, 1024)} | {(1, e) for e in (512, 768, 1024)}
    assert served_boundary([FULL, wide], 256, 1024, lambda g, e: (g, e) in stored) == 1024
    # bytes per token: as full attention, never more (a per-boundary copy would store 600/256 times the chunk)
    assert bytes_per_token([wide], 256, 4096) == 1000 * 5 / 16


def test_bad_group_shapes_are_refused() -> None:
    with pytest.raises(ConfigError, match="needs its window"):
        GroupShape(GroupKind.SLIDING, 16, 1, 1)
    with pytest.raises(ConfigError, match="positive"):
        GroupShape(GroupKind.FULL, 0, 1, 1)


def test_groups_have_distinct_scope_tags() -> None:
    tags = {FULL.scope_tag(0), SLIDE.scope_tag(1), SLIDE.scope_tag(2), STATE.scope_tag(3)}
    assert len(tags) == 4  # two groups of one shape still differ


def test_each_group_registers_its_own_layout_and_scope() -> None:
    from connector.vllm.window import group_keys, group_layout
    from kvstore.layout import KVLayout

    attention = KVLayout(num_layers=6, num_kv_heads=1, head_dim=32, dtype="bfloat16", chunk_tokens=256)
    full = GroupShape(GroupKind.FULL, 16, attention.bytes_per_token // 6 * 16, 1)
    slide = GroupShape(GroupKind.SLIDING, 16, full.page_bytes, 5, window=64)
    state = GroupShape(GroupKind.STATE, 256, 131072, 3)
    layouts = [group_layout(s, attention) for s in (full, slide, state)]
    assert layouts[0].chunk_bytes == full.page_bytes * 16  # 256 tokens, one layer
    assert layouts[1].chunk_bytes == slide.page_bytes * 5 * 5  # 5 window blocks (63 tokens may span 5), 5 layers
    assert layouts[1].chunk_bytes >= chunk_bytes_at(slide, 4096)
    assert layouts[2].chunk_bytes == 131072 * 3
    model_keys = [b"k" * 16, b"j" * 16]
    groups = [(full, layouts[0]), (slide, layouts[1]), (slide, layouts[1]), (state, layouts[2])]  # two alike
    keys = {k for i, (s, lay) in enumerate(groups) for k in group_keys(model_keys, s, i, lay)}
    assert len(keys) == 8 and not keys & set(model_keys)


def chunk_bytes_at(shape: GroupShape, boundary: int) -> int:
    return len(boundary_blocks(shape, boundary)) * shape.page_bytes * shape.num_layers


def test_block_ids_are_picked_per_group_and_a_freed_block_refuses_the_chunk() -> None:
    from connector.vllm.window import group_block_ids

    full_table = list(range(100, 116))  # 16 blocks: tokens 0..255
    window_table = [0] * 12 + [212, 213, 214, 215]  # vLLM freed the blocks out of the window (null block 0)
    assert group_block_ids([FULL, SLIDE], [full_table, window_table], 0, 256) == [full_table,
                                                                                  [212, 213, 214, 215]]
    assert group_block_ids([FULL, SLIDE], [full_table, window_table], 0, 128) is None  # its window was freed
    assert group_block_ids([FULL, SLIDE], [full_table[:8], window_table], 0, 256) is None  # not allocated yet
    with pytest.raises(ConfigError, match="2 KV cache groups; the connector knows 3"):
        group_block_ids([FULL, SLIDE, STATE], [full_table, window_table], 0, 256)
