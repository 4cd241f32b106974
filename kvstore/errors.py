"""The kvstore exception hierarchy: one root, one class per thing a caller can act on."""


class KVStoreError(Exception):
    """Root of every error kvstore raises on purpose; catch this to catch them all."""


class ConfigError(KVStoreError, ValueError):
    """A configuration value is invalid. Raised at construction; fix the named field and retry."""


class UnknownNameError(ConfigError, KeyError):
    """A name (tier, policy, codec, preset) is not registered; the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownTierError(UnknownNameError):
    """A tier kind in the config is not one of `TierKind`."""


class UnknownPolicyError(UnknownNameError):
    """An eviction, admission, compression or scheduling policy name is not registered."""


class LayoutMismatchError(KVStoreError, ValueError):
    """A chunk's shape, dtype or layout fingerprint does not match the store's layout.

    Raised on put with a tensor of the wrong shape/dtype: convert or re-chunk and retry.
    On read of a stored chunk written for another layout it is treated as a miss.
    """


class UnregisteredLayoutError(LayoutMismatchError):
    """A request names a layout fingerprint the daemon does not serve (it restarted without a disk tier, so its
    registrations are gone): register the layout again (KVStoreClient does) and retry."""


class BadChunkError(KVStoreError, ValueError):
    """A chunk key or payload is malformed (wrong length, wrong size). Fix the caller."""


class TierFullError(KVStoreError):
    """A tier has no room for a payload even after eviction (everything left is pinned or too small).

    The caller should retry later, release pins, or treat the chunk as not stored.
    """


class TierIOError(KVStoreError, OSError):
    """A tier's I/O failed (disk full, permission, device error). Treat reads as a miss;
    for writes the chunk is not stored in that tier and `stats` counts it."""


class CorruptChunkError(KVStoreError):
    """A stored chunk failed its checksum or header check. The store drops it, counts it and
    treats it as a miss; the caller recomputes those tokens."""


class BackpressureError(KVStoreError):
    """A bounded queue stayed full for the whole wait. The chunks named were not stored there."""


class NoNodeError(ConfigError):
    """No live node to route to: the cluster's state (heartbeats not reaching Redis), not the caller's input."""
