"""Small shared types: tier kinds, the metadata that travels with a stored chunk, a put's result."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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
