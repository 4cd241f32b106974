"""The `Tier` ABC: mechanism only (bytes, capacity, put/get/contains/remove), never policy.

Payloads are 1-D uint8 torch tensors. A miss returns None; a failure raises a KVStoreError.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import ClassVar, Protocol, TypeVar

import torch

from kvstore.errors import BadChunkError
from kvstore.types import ChunkMeta, TierKind

T = TypeVar("T")


class Arena(Protocol):
    """A memory tier as slots of one arena (tiers/arena.py): zero-copy leases and reserve/commit.

    A reserved or acquired slot is never reused until `commit`/`abort` or `release_slot`.
    """

    @property
    def shm_name(self) -> str | None:
        """The POSIX shared-memory name other processes may map the arena under, or None."""
        ...

    def lease(self, key: bytes) -> AbstractContextManager[tuple[torch.Tensor, ChunkMeta] | None]:
        """A zero-copy view of the slot's payload for the `with` block (None on a miss)."""
        ...

    def reserve(self, nbytes: int) -> int:
        """A free slot's offset; raises TierFullError when none fits."""
        ...

    def commit(self, key: bytes, offset: int, meta: ChunkMeta) -> None: ...

    def abort(self, offset: int) -> None: ...

    def acquire(self, key: bytes) -> tuple[int, ChunkMeta] | None:
        """A read lease on the slot of `key`: (offset, meta), until `release_slot`."""
        ...

    def release_slot(self, key: bytes, offset: int) -> None: ...

    def slot_view(self, offset: int, nbytes: int) -> torch.Tensor:
        """The arena's bytes at a slot; valid only while it stays reserved or acquired."""
        ...


class Tier(ABC):
    """One place chunk bytes live.

    Callers (the TieredStore) make room before `put`: a tier never evicts on its own, it raises
    TierFullError. `get_into` reads into a caller buffer (no extra copy) and returns the number of
    bytes written. Implementations are thread-safe.

    Capabilities are declared here, so the store asks the tier instead of probing attributes:
    `is_memory`, `is_shared`, `supports_device_io` and `as_arena()`.
    """

    kind: ClassVar[TierKind]
    is_memory: ClassVar[bool] = False  # byte-addressable and fast: no worker pool needed
    is_shared: ClassVar[bool] = False  # other processes/nodes write it too: ask the tier, not only the index

    @property
    def is_durable(self) -> bool:
        """A copy here survives this process and the tier's own restart (disk files: yes; memory: no;
        Redis: only with AOF or RDB persistence). A put waits for a durable copy."""
        return not self.is_memory

    def __init__(self, *, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise BadChunkError(f"{type(self).__name__} capacity must be positive, got {capacity_bytes}")
        self._capacity_bytes = int(capacity_bytes)

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def supports_device_io(self) -> bool:
        """True when `get_into` reads straight into device (CUDA) memory (GPUDirect), so the store
        hands it the caller's device buffer instead of a host staging buffer."""
        return False

    def as_arena(self) -> Arena | None:
        """This tier as an arena of slots (zero-copy leases, reserve/commit), or None when it is not one."""
        return None

    @property
    @abstractmethod
    def used_bytes(self) -> int:
        """Bytes currently accounted to stored payloads (including alignment padding)."""

    def footprint(self, stored_bytes: int) -> int:
        """Bytes a payload of `stored_bytes` takes in this tier (alignment, headers)."""
        return stored_bytes

    def can_fit(self, stored_bytes: int) -> bool:
        return self.used_bytes + self.footprint(stored_bytes) <= self.capacity_bytes

    @abstractmethod
    def put(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> None:
        """Store `payload` (1-D uint8) under `key`, replacing any old copy.

        Raises:
            TierFullError: no room; the caller must evict first.
            TierIOError: the write failed; nothing partial is visible.
        """

    @abstractmethod
    def get_into(self, key: bytes, out: torch.Tensor) -> int | None:
        """Copy the payload into `out[:n]` and return n, or None on a miss.

        Raises:
            CorruptChunkError: the stored bytes failed their checksum (the tier has dropped them).
            BadChunkError: `out` is too small.
        """

    def get_into_streamed(self, key: bytes, out: torch.Tensor, on_ready: Callable[[int], None]) -> int | None:
        """`get_into`, calling `on_ready(n)` whenever the first n payload bytes have landed in `out`, the last
        call with the whole payload, so a decoder can work on the front while the back is still read.
        On a miss `on_ready` is not called; after a CorruptChunkError the bytes it announced may be garbage.
        The default reads the whole payload, then calls `on_ready` once; disk tiers read in segments."""
        nbytes = self.get_into(key, out)
        if nbytes is not None:
            on_ready(nbytes)
        return nbytes

    @abstractmethod
    def meta(self, key: bytes) -> ChunkMeta | None:
        """The stored chunk's metadata, or None on a miss."""

    def contains(self, key: bytes) -> bool:
        return self.meta(key) is not None

    @abstractmethod
    def remove(self, key: bytes) -> bool:
        """Drop the chunk; True when it was there."""

    @abstractmethod
    def keys(self) -> Iterator[tuple[bytes, ChunkMeta]]:
        """Every stored chunk with its metadata (disk tiers scan their headers: recovery)."""

    def put_many(self, items: Sequence[tuple[bytes, torch.Tensor, ChunkMeta]]) -> None:
        for key, payload, meta in items:
            self.put(key, payload, meta)

    def get_many(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> list[int | None]:
        return [self.get_into(key, out) for key, out in zip(keys, outs, strict=True)]

    def submit_put(self, key: bytes, payload: torch.Tensor, meta: ChunkMeta) -> Future[None]:
        """Start a put; slow tiers run it on their worker pool, fast ones complete it now."""
        return _run_now(self.put, key, payload, meta)

    def submit_get(self, key: bytes, out: torch.Tensor) -> Future[int | None]:
        return _run_now(self.get_into, key, out)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files, pools and memory. The tier must not be used afterwards."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(used={self.used_bytes}, capacity={self.capacity_bytes})"


def _run_now(fn: Callable[..., T], *args: object) -> Future[T]:
    future: Future[T] = Future()
    try:
        future.set_result(fn(*args))
    except BaseException as exc:
        future.set_exception(exc)
    return future


def check_payload(payload: torch.Tensor) -> None:
    if payload.dtype != torch.uint8 or payload.dim() != 1 or not payload.is_contiguous():
        raise BadChunkError(
            f"tier payloads are contiguous 1-D uint8 tensors, got dtype={payload.dtype} shape={tuple(payload.shape)}; "
            "use tensor.contiguous().view(torch.uint8).reshape(-1)"
        )


def check_out(out: torch.Tensor, nbytes: int) -> None:
    if out.dtype != torch.uint8 or out.dim() != 1 or not out.is_contiguous():
        raise BadChunkError(f"output buffers are contiguous 1-D uint8 tensors, got dtype={out.dtype} shape={tuple(out.shape)}")
    if out.numel() < nbytes:
        raise BadChunkError(f"output buffer holds {out.numel()} bytes but the chunk is {nbytes}; pass a larger buffer")
