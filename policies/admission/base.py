"""The `AdmissionPolicy` protocol: decide whether a chunk that missed is stored in a tier."""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Protocol, runtime_checkable

from policies.eviction.base import AccessInfo

logger = logging.getLogger(__name__)


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides admission; never moves bytes.

    For every miss the cache calls `on_miss(key, info)` first, then `admit(key, info)`; when
    `admit` returns True it stores the chunk and tells the eviction policy (`on_insert`).
    `on_evict(key)` is called when a chunk leaves the tier, so ghost-based policies can remember it.
    `admit` has no side effects: calling it twice gives the same answer.
    """

    name: str

    def on_miss(self, key: Hashable, info: AccessInfo) -> None: ...

    def admit(self, key: Hashable, info: AccessInfo) -> bool: ...

    def on_evict(self, key: Hashable) -> None: ...
