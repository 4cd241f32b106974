"""The stamped structures behind `adaptive`'s speed (_fifo.py, _expert_lru.py): a StampedQueue keeps
exactly an OrderedDict's order in bounded memory, and both LRU experts decide alike."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable

import pytest

from policies.eviction._expert_lru import COMPILED, LRU, OrderedLRUExpert, StampedLRUExpert
from policies.eviction._fifo import SLACK, StampedQueue
from tests.policies.conftest import random_stream


def test_a_stamped_queue_keeps_an_ordered_dicts_order_in_bounded_memory() -> None:
    """Random moves to the back, removals and pops from the front (an LRU list's steps), checked
    step by step against an OrderedDict; many moves of few keys make dead entries pile up, and
    the compaction keeps the lists within four entries per live key plus 3 x SLACK."""
    rng = random.Random(7)
    model: OrderedDict[Hashable, None] = OrderedDict()
    queue, index, clock = StampedQueue(), {}, 0
    longest = 0
    for _ in range(30 * SLACK):
        key, step = rng.randrange(200), rng.random()
        if step < 0.7:  # touch: to the back
            if key in index:
                queue.live -= 1
                del model[key]
            clock += 1
            index[key] = clock
            queue.push(key, clock, index)  # type: ignore[arg-type]
            model[key] = None
        elif step < 0.8 and key in index:  # removed by its owner
            del index[key]
            queue.live -= 1
            del model[key]
        elif model:  # evict the oldest
            assert queue.first(index) == index[next(iter(model))]  # type: ignore[arg-type, index]
            assert queue.pop_first(index) == model.popitem(last=False)[0]  # type: ignore[arg-type]
        assert queue.live == len(model) == len(index)
        longest = max(longest, len(queue.keys))
    assert queue.live_keys(index) == list(model)  # type: ignore[arg-type]
    assert longest <= 4 * 200 + 3 * SLACK + 1  # the bound _fifo.py states, 200 keys at most live


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("capacity", [1, 16, 90])
def test_both_lru_experts_hit_and_drop_alike(seed: int, capacity: int) -> None:
    """`LRU` picks the stamped expert when compiled and the OrderedDict one interpreted: one rule
    either way, the same hits, evictions and order, on streams long enough to compact."""
    stream = random_stream(seed, length=6 * SLACK, num_keys=120)
    stamped, ordered = StampedLRUExpert(capacity), OrderedLRUExpert(capacity)
    stamped.drops, ordered.drops = [], []
    assert [stamped.access(key) for key in stream] == [ordered.access(key) for key in stream]
    assert stamped.drops == ordered.drops and list(stamped.order()) == list(ordered.order())
    assert LRU is (StampedLRUExpert if COMPILED else OrderedLRUExpert)
