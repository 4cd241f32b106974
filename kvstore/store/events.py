"""`StoreEvents`: the store's listeners, told of every chunk stored in or removed from a tier, and of every
chunk that left the index altogether."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvstore.hashing import ChunkKey
from kvstore.stats import Counters
from kvstore.types import StoreEvent, TierKind

logger = logging.getLogger(__name__)


class StoreEvents:
    """Listeners and the emit that calls them; `holds(key)` says whether the index still has a key, so a drop
    listener hears only of chunks gone from every tier. A listener's exception is counted
    (`listener_errors`) and logged, never raised into the put or eviction that emitted."""

    def __init__(self, counters: Counters, holds: Callable[[ChunkKey], bool]) -> None:
        self._counters = counters
        self._holds = holds
        self._listeners: list[Callable[[StoreEvent], None]] = []
        self._drop_listeners: list[Callable[[ChunkKey], None]] = []

    def add_listener(self, listener: Callable[[StoreEvent], None]) -> None:
        self._listeners.append(listener)

    def add_drop_listener(self, listener: Callable[[ChunkKey], None]) -> None:
        self._drop_listeners.append(listener)

    def emit(self, kind: str, key: ChunkKey, tier: TierKind) -> None:
        for listener in self._listeners:
            try:
                listener(StoreEvent(kind, key, tier))
            except Exception:  # a listener's bug must not fail a put or an eviction
                self._counters.incr("listener_errors")
                logger.exception("store event listener %r failed", listener)
        if kind == "removed" and self._drop_listeners and not self._holds(key):
            for dropped in self._drop_listeners:
                try:
                    dropped(key)
                except Exception:
                    self._counters.incr("listener_errors")
                    logger.exception("store drop listener %r failed", dropped)
