"""`Expert`: what every key-only simulated cache that `adaptive` runs and follows provides.

A base class rather than a union or a Protocol: compiled by mypyc (policies/eviction/_native.py),
a call through a base class is a native vtable call, where a union or Protocol is a generic
Python method call on the replay's hot path (the driver's `access` on every block).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Hashable, Iterable, Iterator
from typing import ClassVar


class Expert(ABC):
    """A whole cache of `capacity` keys; evicted keys are appended to `drops` when it is a list
    (a list rather than a callback: under mypyc an append is a native call, a callback is not)."""

    name: ClassVar[str] = ""
    capacity: int
    drops: list[Hashable] | None

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.drops = None

    @abstractmethod
    def access(self, key: Hashable, partial: bool = False) -> bool:
        """Whether `key` was held; admits it (evicting as the policy does) when it was not."""
        ...

    @abstractmethod
    def resize(self, capacity: int) -> None:
        ...

    @abstractmethod
    def __contains__(self, key: Hashable) -> bool:
        ...

    @abstractmethod
    def order(self) -> Iterator[Hashable]:
        """The held keys in eviction order (roughly, for ARC)."""
        ...

    @abstractmethod
    def reused(self) -> Container[Hashable]:
        """Held keys this expert saw reused (another expert seeds them into its protected part)."""
        ...

    @abstractmethod
    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        """Fill an empty expert with `keys`, oldest first."""
        ...
