"""`MetaIds`: chunk metadata by a small integer id, so a memory tier's slot can keep its metadata in one int.

Most chunks of a tier share one metadata value (every raw chunk of a layout has the same), so the table
holds a handful of entries; compressed chunks add one per distinct stored size. Each id counts the slots
using it and is reused once none does. Not thread-safe: the owning tier holds its lock.
"""

from __future__ import annotations

from kvstore.errors import TierFullError
from kvstore.types import ChunkMeta


class MetaIds:
    """ChunkMeta <-> id in [0, limit), counted per use (`add` / `release`)."""

    __slots__ = ("_free", "_ids", "_limit", "_metas", "_uses")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._ids: dict[ChunkMeta, int] = {}
        self._metas: list[ChunkMeta | None] = []
        self._uses: list[int] = []
        self._free: list[int] = []

    def add(self, meta: ChunkMeta) -> int:
        """The id of `meta` (an equal value shares it), counted as one more use.

        Raises:
            TierFullError: `limit` distinct values are in use already (the message says what to do).
        """
        i = self._ids.get(meta)
        if i is None:
            if self._free:
                i = self._free.pop()
                self._metas[i] = meta
            elif len(self._metas) < self._limit:
                i = len(self._metas)
                self._metas.append(meta)
                self._uses.append(0)
            else:
                raise TierFullError(f"memory tier: {self._limit:,} distinct chunk metadata values are held (compressed "
                                    "chunks of many sizes and layouts); evict first, or hold compressed chunks on disk")
            self._ids[meta] = i
        self._uses[i] += 1
        return i

    def get(self, i: int) -> ChunkMeta:
        meta = self._metas[i]
        if meta is None:
            raise KeyError(f"metadata id {i} is not in use")
        return meta

    def release(self, i: int) -> None:
        """One use of id `i` fewer; the id is freed with its last use."""
        self._uses[i] -= 1
        meta = self._metas[i]
        if self._uses[i] == 0 and meta is not None:
            del self._ids[meta]
            self._metas[i] = None
            self._free.append(i)

    def __len__(self) -> int:
        """Distinct values in use."""
        return len(self._ids)
