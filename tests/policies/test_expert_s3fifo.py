"""The S3-FIFO expert on plain lists (_experts.py) decides exactly as S3-FIFO on OrderedDicts, the
textbook form it replaced: same hit or miss on every access, same victims in the same order, same
content and reuse marks, through its list compactions and after a seed."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable

import pytest

from policies.eviction._experts import FRONT_SLACK, S3FIFOExpert


class OrderedS3FIFO:
    """S3-FIFO (Yang et al., SOSP'23) on OrderedDicts: small FIFO (10%), main FIFO with reinsertion, ghost."""

    MAX_FREQ = 3

    def __init__(self, capacity: int, small_ratio: float = 0.1) -> None:
        self.capacity = capacity
        self.small_target = max(1, int(capacity * small_ratio))
        self.ghost_limit = max(1, capacity - int(capacity * small_ratio))
        self.small: OrderedDict[Hashable, None] = OrderedDict()
        self.main: OrderedDict[Hashable, None] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self.freq: dict[Hashable, int] = {}
        self.drops: list[Hashable] = []

    def access(self, key: Hashable) -> bool:
        if key in self.freq:
            self.freq[key] = min(self.freq[key] + 1, self.MAX_FREQ)
            return True
        while len(self.freq) >= self.capacity:
            self.evict()
        self.freq[key] = 0
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = None
        else:
            self.small[key] = None
        return False

    def evict(self) -> None:
        if len(self.small) >= self.small_target or not self.main:
            while self.small:
                key, _ = self.small.popitem(False)
                if self.freq[key] > 0:
                    self.main[key] = None
                    self.freq[key] = 0
                    continue
                del self.freq[key]
                self.ghost[key] = None
                if len(self.ghost) > self.ghost_limit:
                    self.ghost.popitem(False)
                self.drops.append(key)
                return
        while self.main:
            key, _ = self.main.popitem(False)
            if self.freq[key] > 0:
                self.main[key] = None
                self.freq[key] -= 1
                continue
            del self.freq[key]
            self.drops.append(key)
            return


def _stream(seed: int, length: int, num_keys: int) -> list[int]:
    """Skewed reuse (a hot set) mixed with one-shot keys, so that both queues and the ghost work."""
    rng = random.Random(seed)
    fresh = num_keys
    out = []
    for _ in range(length):
        if rng.random() < 0.3:
            fresh += 1
            out.append(fresh)
        else:
            out.append(min(int(rng.paretovariate(0.8)) - 1, num_keys - 1))
    return out


@pytest.mark.parametrize(("seed", "capacity"), [(0, 5), (1, 40), (2, 300), (3, 1)])
def test_the_list_expert_decides_exactly_as_the_ordered_dict_one(seed: int, capacity: int) -> None:
    stream = _stream(seed, length=40 * FRONT_SLACK, num_keys=4 * capacity + 10)
    expert, reference = S3FIFOExpert(capacity), OrderedS3FIFO(capacity)
    expert.drops = []
    longest = 0
    for step, key in enumerate(stream):
        assert expert.access(key) == reference.access(key), f"access {step} (key {key})"
        assert expert.drops == reference.drops, f"victims differ at access {step}"
        longest = max(longest, len(expert.small), len(expert.main))
    assert list(expert.order()) == [*reference.small, *reference.main]
    assert set(expert.reused()) == set(reference.main)  # type: ignore[call-overload]
    assert set(expert.ghost) == set(reference.ghost)
    assert len(reference.drops) > 4 * FRONT_SLACK, "the lists' consumed fronts were cut off along the way"
    assert longest <= 2 * capacity + 2 * FRONT_SLACK + 2, "the lists stay bounded: their fronts are cut off"


def test_a_seeded_expert_holds_the_keys_in_order_with_the_reused_ones_in_main() -> None:
    expert = S3FIFOExpert(10)
    expert.seed(range(8), reused={2, 5})
    assert list(expert.order()) == [0, 1, 3, 4, 6, 7, 2, 5]
    assert set(expert.reused()) == {2, 5}  # type: ignore[call-overload]
    assert all(key in expert for key in range(8)) and 8 not in expert
    expert.drops = []
    for key in (8, 9, 10):  # the tenth key fills it; the eleventh evicts the oldest unused small key
        expert.access(key)
    assert expert.drops == [0]
