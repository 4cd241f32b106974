"""`SlotTable` and `KeySet` (_fifo.py): the compact tables behind the hazard expert and `adaptive`'s
resident keys keep a dict's lookups and an OrderedDict's order, and a ghost keeps no key object."""

from __future__ import annotations

import gc
import random
import weakref
from collections import OrderedDict

from policies.eviction._expert_hazard import HazardExpert
from policies.eviction._fifo import NO_SLOT, KeySet, SlotTable


def test_a_slot_table_keeps_a_dicts_lookups_and_each_lists_order() -> None:
    """Random adds, moves between lists and removals of up to 3,000 hashes, checked step by step against
    one OrderedDict per list: the index grows and deletes (backward shift) without losing a hash. Hashes
    that share their low bits and negative ones are in the mix."""
    rng = random.Random(3)
    table = SlotTable(3)
    model: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(3)]
    slot_of: dict[int, int] = {}
    pool = [rng.randrange(-(1 << 63), 1 << 63) for _ in range(2000)] + [i << 40 for i in range(1000)]
    for step in range(40000):
        h = rng.choice(pool)
        lst = rng.randrange(3)
        where = next((i for i in range(3) if h in model[i]), -1)
        assert table.find(h) == (slot_of[h] if where >= 0 else NO_SLOT)
        if where < 0:
            slot_of[h] = table.add(h, None, step, lst)
            model[lst][h] = step
        elif rng.random() < 0.5:  # to the back of a list
            table.unlink(where, slot_of[h])
            table.push(lst, slot_of[h])
            del model[where][h]
            model[lst][h] = step
        else:
            table.remove(slot_of.pop(h), where)
            del model[where][h]
        assert table.count == len(slot_of)
    for i in range(3):
        assert [table.hashes[slot] for slot in table.slots(i)] == list(model[i])
        assert table.sizes[i] == len(model[i])
    assert all(table.find(h) == slot for h, slot in slot_of.items())


def test_a_key_set_iterates_in_a_dicts_insertion_order() -> None:
    rng = random.Random(4)
    keys, model = KeySet(), dict[object, None]()
    for _ in range(20000):
        key = rng.choice([rng.randrange(500), f"k{rng.randrange(500)}", (1, rng.randrange(50))])
        if rng.random() < 0.6:
            keys.add(key)
            model.setdefault(key, None)
        else:
            keys.discard(key)
            model.pop(key, None)
        assert (key in keys) == (key in model) and len(keys) == len(model)
    assert list(keys) == list(model)


class _Key:
    """A key that can be watched: it dies when no structure holds it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.n == self.n


def test_the_hazard_ghost_remembers_a_key_by_its_hash_alone() -> None:
    """Regression (issue 43, memory per chunk): the ghost kept every evicted key object, 2 capacities of
    them (about 48 bytes each for a 16-byte key) that the store no longer holds."""
    expert = HazardExpert(2)
    first = _Key(1)
    watch = weakref.ref(first)
    for key in (first, _Key(2), _Key(3)):
        expert.access(key)
    del first, key
    gc.collect()
    assert watch() is None, "the ghost still holds the evicted key"
    assert expert.ghost_class_of(_Key(1)) == 0 and _Key(1) not in expert
    assert not expert.access(_Key(1)) and _Key(1) in expert  # a ghost hit, back one class up
