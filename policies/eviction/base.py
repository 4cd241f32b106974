"""The `EvictionPolicy` protocol and the per-access hints a prefix cache can give it."""

from __future__ import annotations

from collections.abc import Container, Hashable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class AccessInfo:
    """What the cache knows about one chunk access, online.

    Attributes:
        size_bytes: bytes the chunk takes in the tier.
        position: index of the chunk in its prefix chain (0 = first chunk of the prompt).
        parent: key of the previous chunk in the chain, None for the head.
        request_hit: whether the request this access belongs to hit at least its first chunk.
        root: key of the chain's head chunk (position 0), None when unknown; identifies the
            conversation or shared system prompt the chunk belongs to.
        chain_chunks: number of chunks in the request's chain (0 = unknown).
        is_partial: the chunk holds fewer tokens than a full chunk (a prompt's last, partly filled
            block); its key changes when the prompt grows, so it is rarely seen again.
    """

    size_bytes: int = 1
    position: int = 0
    parent: Hashable | None = None
    request_hit: bool = False
    root: Hashable | None = None
    chain_chunks: int = 0
    is_partial: bool = False


@runtime_checkable
class EvictionPolicy(Protocol):
    """Decides eviction order; never moves bytes.

    The cache calls `on_insert` when a chunk becomes resident, `on_access` on every hit,
    `on_remove` when it leaves (evicted or deleted). `victims` has no side effects: it proposes,
    in eviction order, up to `n` resident keys not in `pinned`; the cache removes them and then
    calls `on_remove`. Implementations need not be thread-safe: the store makes every call
    under its index lock.
    """

    name: str

    def on_insert(self, key: Hashable, info: AccessInfo) -> None: ...

    def on_access(self, key: Hashable, info: AccessInfo) -> None: ...

    def on_remove(self, key: Hashable) -> None: ...

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]: ...

    def __len__(self) -> int: ...
