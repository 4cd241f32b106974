"""The index's compact `Entry`: levels as a bit mask, one shared metadata object or a tuple by level, pending
writes as a mask; what it answers is what the per-level dict and set it replaced answered."""

from __future__ import annotations

import random

from kvstore.store.entry import Entry
from kvstore.types import ChunkMeta, shared_meta

RAW = ChunkMeta(codec_id=0, raw_bytes=4096, stored_bytes=4096, layout_fingerprint=7)
PACKED = ChunkMeta(codec_id=2, raw_bytes=4096, stored_bytes=1500, layout_fingerprint=7)


def test_one_shared_meta_while_every_level_has_the_same_and_a_tuple_when_they_differ() -> None:
    entry = Entry(position=3)
    assert entry.set_meta(2, RAW) and entry.levels() == [2] and entry.fastest() == 2
    assert entry.set_meta(0, RAW) and entry.levels() == [0, 2]
    assert entry.meta(0) is RAW and entry.meta(1) is None and entry.meta(2) is RAW
    assert not entry.set_meta(2, PACKED)  # the level held a copy: not new
    assert entry.meta(2) is PACKED and entry.meta(0) is RAW and entry.metas() == {0: RAW, 2: PACKED}
    assert entry.drop(0) is RAW and entry.levels() == [2] and entry.meta(2) is PACKED
    assert entry.drop(0) is None
    assert entry.drop(2) is PACKED and entry.mask == 0 and entry.fastest() is None and entry.metas() == {}


def test_pending_writes_pin_and_count_as_copies_below() -> None:
    entry = Entry()
    entry.set_meta(0, RAW)
    assert not entry.is_pinned and not entry.has_copy_below(0)
    entry.pending |= 1 << 1
    assert entry.is_pinned and entry.has_copy_below(0) and not entry.has_copy_below(1)
    entry.pending &= ~(1 << 1)
    assert not entry.is_pinned
    entry.pins += 1
    assert entry.is_pinned


def test_random_changes_answer_as_a_dict_by_level_does() -> None:
    rng = random.Random(5)
    metas = [RAW, PACKED, ChunkMeta(codec_id=1, raw_bytes=4096, stored_bytes=2000, layout_fingerprint=7)]
    entry, model = Entry(), {}
    for _ in range(2000):
        level = rng.randrange(5)
        if rng.random() < 0.6:
            meta = rng.choice(metas)
            assert entry.set_meta(level, meta) == (level not in model)
            model[level] = meta
        else:
            assert entry.drop(level) is model.pop(level, None)
        assert entry.metas() == model and entry.levels() == sorted(model)
        assert entry.fastest() == (min(model) if model else None)
        assert all(entry.has_copy_below(lv) == any(o > lv for o in model) for lv in range(5))


def test_shared_meta_keeps_one_object_per_value() -> None:
    first = shared_meta(ChunkMeta(codec_id=0, raw_bytes=12345, stored_bytes=12345, layout_fingerprint=99))
    again = shared_meta(ChunkMeta(codec_id=0, raw_bytes=12345, stored_bytes=12345, layout_fingerprint=99))
    assert again is first
