"""Admission policies `always`, `second_hit` (seen twice) and `ghost` (a ghost list says it would have hit)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable

from kvstore.errors import ConfigError
from policies.admission.registry import register_admission_policy
from policies.eviction.base import AccessInfo

logger = logging.getLogger(__name__)


@register_admission_policy
class AlwaysAdmission:
    """Admit every chunk (the default: a tier stores everything it is given)."""

    name = "always"

    def __init__(self, capacity: int | None = None) -> None:
        del capacity

    def on_miss(self, key: Hashable, info: AccessInfo) -> None:
        pass

    def admit(self, key: Hashable, info: AccessInfo) -> bool:
        return True

    def on_evict(self, key: Hashable) -> None:
        pass


class _BoundedKeySet:
    """Most recently seen keys, oldest dropped first once `max_keys` is reached."""

    def __init__(self, max_keys: int) -> None:
        if max_keys <= 0:
            raise ConfigError(f"an admission key memory needs max_keys > 0, got {max_keys}")
        self.max_keys = max_keys
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def add(self, key: Hashable) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)


class _RepeatAdmission:
    """Admit a missed chunk when its key is in a bounded memory of keys (a repeat).

    `on_miss` notes whether the key was remembered, then remembers it; `admit` answers for the
    last missed key, so it is side-effect free and needs no per-key state beyond the memory.
    """

    name = ""

    def __init__(self, max_keys: int) -> None:
        self._memory = _BoundedKeySet(max_keys)
        self._last: tuple[Hashable, bool] | None = None

    def on_miss(self, key: Hashable, info: AccessInfo) -> None:
        self._last = (key, key in self._memory)
        self._memory.add(key)

    def admit(self, key: Hashable, info: AccessInfo) -> bool:
        return self._last is not None and self._last[0] == key and self._last[1]

    def on_evict(self, key: Hashable) -> None:
        pass


@register_admission_policy
class SecondHitAdmission(_RepeatAdmission):
    """Admit a chunk the second time it misses: one-hit wonders never enter the tier.

    Args:
        capacity: chunks the tier holds; the memory of seen keys is `history_factor` times that
            (None: 1,000,000 keys).
    """

    name = "second_hit"

    def __init__(self, capacity: int | None = None, history_factor: float = 8.0) -> None:
        super().__init__(max(1, int(capacity * history_factor)) if capacity else 1_000_000)


@register_admission_policy
class GhostAdmission(_RepeatAdmission):
    """Admit a chunk only when a ghost list holds it: keys recently missed or evicted (no bytes),
    i.e. a cache `ghost_factor` times larger would have hit it. Evicted keys join the ghost, so a
    chunk evicted too early comes straight back on its next miss.

    Args:
        capacity: chunks the tier holds; the ghost remembers `ghost_factor` times that many keys.
    """

    name = "ghost"

    def __init__(self, capacity: int | None = None, ghost_factor: float = 2.0) -> None:
        super().__init__(max(1, int(capacity * ghost_factor)) if capacity else 1_000_000)

    def on_evict(self, key: Hashable) -> None:
        self._memory.add(key)
