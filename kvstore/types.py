"""Small shared types: tier kinds, chunk metadata, a put's result, and the `ChunkStore` contract."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from kvstore.hashing import TokenIds
    from kvstore.kv_scope import KeyScope
    from kvstore.layout import KVLayout

# A chunk file's name in a disk tier (tiers/chunk_files.py): 32 hex digits of its key, then this. Here, not
# in kvstore/chunk_format.py, so start-up checks can tell chunk files apart without loading numpy.
CHUNK_SUFFIX = ".kvc"


class TierKind(enum.Enum):
    """Where chunk bytes live, fastest first in declaration order."""

    GPU = "gpu"
    HOST = "host"
    NVME = "nvme"
    PFS = "pfs"
    REDIS = "redis"

    @classmethod
    def parse(cls, name: str) -> TierKind:
        from kvstore.errors import UnknownTierError

        try:
            return cls(str(name).lower())
        except ValueError:
            raise UnknownTierError(
                f"unknown tier kind {name!r}; valid kinds: {', '.join(k.value for k in cls)}"
            ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkMeta:
    """What a tier keeps beside a payload: how it was encoded and for which layout."""

    codec_id: int
    raw_bytes: int
    stored_bytes: int
    layout_fingerprint: int


MAX_SHARED_METAS = 4096  # distinct metadata values shared; raw chunks of a few layouts need a handful


_SHARED_METAS: dict[ChunkMeta, ChunkMeta] = {}


def shared_meta(meta: ChunkMeta) -> ChunkMeta:
    """`meta`, or the equal one already shared. The index and the tiers keep one metadata object per chunk
    and tier, millions of them, yet most are equal (every raw chunk of one layout has the same), so they
    keep this one. Bounded: past MAX_SHARED_METAS values (compressed sizes vary per chunk) `meta` itself."""
    found = _SHARED_METAS.get(meta)
    if found is not None:
        return found
    if len(_SHARED_METAS) < MAX_SHARED_METAS:
        return _SHARED_METAS.setdefault(meta, meta)
    return meta


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """A change a listener (cluster index, event stream) may want: `kind` is "stored" or "removed"."""

    kind: str
    key: bytes
    tier: TierKind


@dataclass(slots=True)
class PutResult:
    """What a put did, chunk by chunk. Nothing is dropped silently.

    stored: keys now held (in the top level at least), including ones already present.
    not_stored: key -> reason, for chunks that are in no tier at all.
    not_replicated: key -> reason, for stored chunks whose lower-tier copy was not queued.
    """

    stored: list[bytes] = field(default_factory=list)
    not_stored: dict[bytes, str] = field(default_factory=dict)
    not_replicated: dict[bytes, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.not_stored

    def merge(self, part: PutResult) -> None:
        """Add what another put (e.g. the next batch) did."""
        self.stored += part.stored
        self.not_stored.update(part.not_stored)
        self.not_replicated.update(part.not_replicated)


@runtime_checkable
class ChunkStore(Protocol):
    """What the connector and the engine need from a store: the embedded `TieredStore` and the
    daemon's `connector.client.KVStoreClient` both satisfy it (checked by mypy and by
    tests/service/test_chunk_store_contract.py).

    Keys are 16-byte chunk keys in prefix order; chunks are `layout.chunk_shape` tensors of
    `layout.torch_dtype`. A failed read is a miss (False), never an exception.
    """

    layout: KVLayout

    def chunk_keys(self, token_ids: TokenIds, scope: KeyScope | None = None) -> list[bytes]:
        """Keys of the full chunks of a prompt (token ids: list, array or tensor), in prefix order. With a
        `scope` (kvstore.kv_scope: model, adapter, salt) the keys are that scope's; without, the store's own."""
        ...

    def lookup(self, token_ids: TokenIds, scope: KeyScope | None = None) -> int:
        """Leading tokens held (a multiple of chunk_tokens)."""
        ...

    def lookup_keys(self, keys: Sequence[bytes]) -> int:
        """Leading keys held, walking until the first miss."""
        ...

    def contains(self, key: bytes) -> bool: ...

    def put_many(self, keys: Sequence[bytes], chunks: Sequence[torch.Tensor]) -> PutResult: ...

    def get_many(self, keys: Sequence[bytes], outs: Sequence[torch.Tensor]) -> list[bool]: ...

    def empty_chunk(self) -> torch.Tensor:
        """An uninitialised chunk buffer suited to `get_many` (4 KiB aligned where that saves a copy)."""
        ...

    def remove(self, key: bytes) -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until queued lower-tier writes are done; True when drained."""
        ...

    def close(self) -> None: ...
