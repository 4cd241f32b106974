"""S3-FIFO (`s3fifo`, Yang et al., SOSP'23): a small probationary FIFO, a main FIFO and a ghost FIFO.

::

    new key ──> S (10%) ──accessed while in S──> M (90%, reinsertion while freq > 0)
                 │ not accessed                   │ freq == 0
                 v                                v
               ghost G (keys only) ──miss found in G──> inserted straight into M

Most chunks are used once; they pass through S and leave without disturbing M ("quick demotion").
`victims` plans the evictions on a virtual copy (no side effects); when the cache then removes
a planned victim, the planned moves before it (S->M promotions, M reinsertions) are applied.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Container, Hashable
from typing import ClassVar

from policies.eviction.base import AccessInfo
from policies.eviction.registry import register_eviction_policy

logger = logging.getLogger(__name__)

MAX_FREQ = 3


class S3FIFOEvictionPolicy:
    """S3-FIFO over chunk keys.

    Args:
        capacity: chunks the tier holds; S's target is `small_ratio` of it and the ghost holds
            as many keys as M. None: sized from the resident count.
        small_ratio: share of capacity for S (paper: 0.1).
        move_threshold: accesses while in S that promote a key to M instead of evicting it.
    """

    name: ClassVar[str] = "s3fifo"

    def __init__(self, capacity: int | None = None, small_ratio: float = 0.1, move_threshold: int = 1) -> None:
        self._capacity = capacity
        self._small_ratio = small_ratio
        self._move_threshold = move_threshold
        self.small: OrderedDict[Hashable, None] = OrderedDict()
        self.main: OrderedDict[Hashable, None] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self.freq: dict[Hashable, int] = {}
        self._plan: list[tuple[str, Hashable, int]] = []
        self._plan_done = 0

    def _size(self) -> int:
        return self._capacity or max(1, len(self))

    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        if key in self.freq:  # re-put of a resident chunk: a touch, not a second copy
            self.on_access(key, info)
            return
        self._plan = []
        self.freq[key] = 0
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = None
        else:
            self.small[key] = None

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        if key in self.freq:
            self._plan = []
            self.freq[key] = min(self.freq[key] + 1, MAX_FREQ)

    def on_remove(self, key: Hashable) -> None:
        if key not in self.freq:
            return
        steps = self._plan[self._plan_done:]
        index = next((i for i, (op, k, _) in enumerate(steps) if op == "evict" and k == key), None)
        if index is None:  # a deletion, not a planned eviction
            self._plan = []
            self.small.pop(key, None)
            self.main.pop(key, None)
            del self.freq[key]
            return
        for op, k, value in steps[:index]:
            if op == "move":
                del self.small[k]
                self.main[k] = None
                self.freq[k] = 0
            elif op == "reinsert":
                self.main.move_to_end(k)
                self.freq[k] = value
        self._plan_done += index + 1
        del self.freq[key]
        if self.small.pop(key, 0) is None:  # left S unused: remember it in the ghost
            self.ghost[key] = None
            while len(self.ghost) > max(1, self._size() - int(self._size() * self._small_ratio)):
                self.ghost.popitem(False)
        else:
            del self.main[key]

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]:
        self._plan = self._make_plan(n, pinned)
        self._plan_done = 0
        return [k for op, k, _ in self._plan if op == "evict"]

    def _make_plan(self, n: int, pinned: Container[Hashable]) -> list[tuple[str, Hashable, int]]:
        small_target = self._size() * self._small_ratio
        s_len, m_len = len(self.small), len(self.main)
        s_iter, m_iter = iter(self.small), iter(self.main)
        tail: deque[tuple[Hashable, int]] = deque()  # keys virtually appended to M, with their freq
        plan: list[tuple[str, Hashable, int]] = []
        evicted = 0
        s_done = m_done = False
        for _ in range(MAX_FREQ * (s_len + m_len) + s_len + 2):
            if evicted >= n or (s_done and m_done):
                break
            if not s_done and (s_len > small_target or m_done):
                key = next(s_iter, None)
                if key is None:
                    s_done = True
                elif key in pinned:
                    continue
                elif self.freq[key] >= self._move_threshold:
                    plan.append(("move", key, 0))
                    tail.append((key, 0))
                    s_len, m_len = s_len - 1, m_len + 1
                else:
                    plan.append(("evict", key, 0))
                    s_len, evicted = s_len - 1, evicted + 1
                continue
            key = next(m_iter, None)
            freq = self.freq[key] if key is not None else 0
            if key is None:
                if not tail:
                    m_done = True
                    continue
                key, freq = tail.popleft()
            if key in pinned:
                continue
            if freq > 0:
                plan.append(("reinsert", key, freq - 1))
                tail.append((key, freq - 1))
            else:
                plan.append(("evict", key, 0))
                m_len, evicted = m_len - 1, evicted + 1
        return plan

    def __len__(self) -> int:
        return len(self.freq)


register_eviction_policy(S3FIFOEvictionPolicy)  # a statement, not a decorator: mypyc compiles only undecorated classes natively
