"""connector.vllm.hybrid: the planner's specs as each KV cache group moves them, and the all-groups lookup."""

from __future__ import annotations

from collections.abc import Sequence

from connector.vllm.hybrid import Group, group_specs, hybrid_lookup, planning_group
from connector.vllm.plan import TransferSpec
from connector.vllm.window import GroupKind, GroupShape, group_layout
from kvstore.layout import KVLayout

ATTN = KVLayout(num_layers=6, num_kv_heads=2, head_dim=32, dtype="float32", chunk_tokens=64)
PAGE = 2 * 2 * 32 * 4 * 16


def _group(kind: GroupKind, index: int, window: int = 0, layers: int = 1) -> Group:
    shape = GroupShape(kind, 16, PAGE, layers, window=window)
    return Group(shape, index, group_layout(shape, ATTN))


SLIDE, FULL, WIDE = _group(GroupKind.SLIDING, 0, 24, 5), _group(GroupKind.FULL, 1), _group(GroupKind.SLIDING, 2, 100)
KEYS = tuple(bytes([i]) * 16 for i in range(3))  # chunks 0..2: tokens 0..191


def _spec(start: int = 0, end: int = 192) -> TransferSpec:
    return TransferSpec("r", KEYS, 0, start, end, tuple(range(100, 100 + end // 16)))


def test_full_attention_moves_every_chunk_in_its_own_keys() -> None:
    table = tuple(range(200, 212))
    (part,) = group_specs(FULL, _spec(), table, 64, load=True)
    assert part.block_ids == table and part.keys == tuple(FULL.keys(KEYS)) and part.start_token == 0
    assert not set(part.keys) & set(KEYS)


def test_a_window_within_a_chunk_saves_each_boundary_and_loads_only_the_last() -> None:
    table = tuple(range(300, 312))
    saved = group_specs(SLIDE, _spec(), table, 64, load=False)
    # window 24 at boundaries 64, 128, 192: tokens 41..63 (blocks 2, 3), 105..127 (6, 7), 169..191 (10, 11)
    assert [p.block_ids for p in saved] == [(302, 303), (306, 307), (310, 311)]
    assert [p.keys for p in saved] == [(k,) for k in SLIDE.keys(KEYS)]
    loaded_table = (0,) * 10 + (410, 411)  # vLLM pads the blocks out of the window with its null block
    (loaded,) = group_specs(SLIDE, _spec(), loaded_table, 64, load=True)
    assert loaded.block_ids == (410, 411) and loaded.keys == (SLIDE.keys(KEYS)[2],)


def test_a_freed_window_block_is_not_saved() -> None:
    table = (0,) * 6 + tuple(range(306, 312))  # vLLM freed blocks 0..5 (out of the window) before this save
    assert [p.block_ids for p in group_specs(SLIDE, _spec(), table, 64, load=False)] == [(306, 307), (310, 311)]


def test_a_wide_window_loads_only_the_chunks_it_overlaps() -> None:
    table = (0,) * 5 + tuple(range(505, 512))  # window 100 at 192: tokens 93..191, blocks 5..11
    (part,) = group_specs(WIDE, _spec(), table, 64, load=True)
    assert part.start_token == 80 and part.first_chunk == 1 and part.keys == tuple(WIDE.keys(KEYS))[1:]


def test_the_lookup_serves_only_what_every_group_holds() -> None:
    held: set[bytes] = set()

    def lookup(keys: Sequence[bytes]) -> int:
        n = 0
        while n < len(keys) and keys[n] in held:
            n += 1
        return n

    groups = [SLIDE, FULL]
    assert planning_group(groups) == 1
    count = hybrid_lookup(groups, [lookup, lookup], 64)
    held.update(FULL.keys(KEYS))
    assert count(KEYS) == 0  # no window piece anywhere
    held.add(SLIDE.keys(KEYS)[1])
    assert count(KEYS) == 2  # the window at 128 is there: a hit of two chunks
    held.add(SLIDE.keys(KEYS)[2])
    assert count(KEYS) == 3
