"""`Expert`: what every key-only simulated cache that `adaptive` runs and follows provides.

A base class rather than a union or a Protocol: compiled by mypyc (policies/eviction/_native.py),
a call through a base class is a native vtable call, where a union or Protocol is a generic
Python method call on the replay's hot path (the driver's `access` on every block).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, ClassVar, Final

if TYPE_CHECKING:  # a type only: mypyc compiles an i64 as a C int64_t (wrapping), Python runs it as an int
    from mypy_extensions import i64

SAMPLE_SCALE: Final = 1 << 16  # `sample_bits` is below SAMPLE_SCALE; a threshold of rate x SAMPLE_SCALE samples that rate
_HASH_MULT: Final = 0x9E3779B97F4A7C15 - (1 << 64)  # as a signed 64-bit int


def sample_bits(key: Hashable) -> int:
    """Bits 48-63 of hash(key) x 0x9E3779B97F4A7C15 mod 2**64, the spatial sampling hash (SHARDS): a key is
    sampled at rate r when these bits are under r x SAMPLE_SCALE. One machine multiply compiled (an i64
    wraps); the same bits from Python's unbounded ints in pure Python. Deterministic for int keys; for
    str/bytes keys it follows PYTHONHASHSEED."""
    h: i64 = hash(key)
    return (h * _HASH_MULT >> 48) & 0xFFFF


def hash_sample_bits(key_hash: int) -> int:
    """`sample_bits` of the key whose hash is `key_hash` (a ghost keeps the hash alone)."""
    h: i64 = key_hash
    return (h * _HASH_MULT >> 48) & 0xFFFF


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
