"""ARC (`arc`, Megiddo & Modha 2003): recency list T1 and frequency list T2 with ghosts B1/B2 and target p.

::

    ghost B1 <- evicted from T1 | T1 (seen once) | T2 (seen twice+) | evicted from T2 -> ghost B2
                                 <--- p --->
    A miss found in B1 means T1 was too small: p grows. Found in B2: p shrinks. The victim comes
    from T1 while |T1| > p (or == p after a B2 hit), else from T2; each list evicts its LRU end.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Container, Hashable
from typing import ClassVar

from policies.eviction.base import AccessInfo
from policies.eviction.registry import register_eviction_policy

logger = logging.getLogger(__name__)


class ARCEvictionPolicy:
    """Adaptive Replacement Cache over chunk keys (unit sizes).

    Args:
        capacity: chunks the tier holds (c); sizes the ghosts (|T1|+|B1| <= c, all four <= 2c).
            None: c follows the largest resident count seen.
    """

    name: ClassVar[str] = "arc"

    def __init__(self, capacity: int | None = None) -> None:
        self._fixed_capacity = capacity
        self._c = capacity or 0
        self.p = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()
        self.t2: OrderedDict[Hashable, None] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()
        self._last_from_b2 = False

    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        if key in self.t1 or key in self.t2:  # re-put of a resident chunk: a touch, not a second copy
            self.on_access(key, info)
            return
        if self._fixed_capacity is None:
            self._c = max(self._c, len(self) + 1)
        self._last_from_b2 = False
        if key in self.b1:  # T1 was too small: favour recency
            self.p = min(float(self._c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:  # T2 was too small: favour frequency
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            del self.b2[key]
            self.t2[key] = None
            self._last_from_b2 = True
        else:
            self.t1[key] = None
        self._trim_ghosts()

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
        elif key in self.t2:
            self.t2.move_to_end(key)

    def on_remove(self, key: Hashable) -> None:
        if key in self.t1:
            del self.t1[key]
            self.b1[key] = None
        elif key in self.t2:
            del self.t2[key]
            self.b2[key] = None
        self._trim_ghosts()

    def _trim_ghosts(self) -> None:
        c = self._c
        while self.b1 and len(self.t1) + len(self.b1) > c:
            self.b1.popitem(False)
        while self.b2 and len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2) > 2 * c:
            self.b2.popitem(False)

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]:
        t1_size, t2_size = len(self.t1), len(self.t2)
        from_t1 = (k for k in self.t1 if k not in pinned)
        from_t2 = (k for k in self.t2 if k not in pinned)
        out: list[Hashable] = []
        while len(out) < n:
            prefer_t1 = t1_size > 0 and (t1_size > self.p or (self._last_from_b2 and t1_size == self.p))
            first, second = (from_t1, from_t2) if prefer_t1 else (from_t2, from_t1)
            key = next(first, None)
            if key is None:
                key = next(second, None)
                if key is None:
                    break
            if key in self.t1:
                t1_size -= 1
            else:
                t2_size -= 1
            out.append(key)
        return out

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)


register_eviction_policy(ARCEvictionPolicy)  # a statement, not a decorator: mypyc compiles only undecorated classes natively
