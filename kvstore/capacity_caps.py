"""`CapacityCap`: a tier that starts below its configured capacity because, at a restart, the machine has less room.

kvstore/preflight.py decides the caps (the rule: docs/capacity.md); the store opens its tiers at the
effective capacity, evicts what a capped disk tier holds beyond it, and reports both figures per tier
(`configured_capacity_bytes` and `capacity_bytes` in stats and /metrics).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from kvstore.config import StoreConfig
from kvstore.types import TierKind
from kvstore.units import format_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityCap:
    """One tier's configured capacity, the effective one it starts with, and the figures that set it.

    Attributes:
        kind: the tier.
        configured_bytes: the capacity in the config.
        effective_bytes: the capacity the tier runs with (below `configured_bytes`, at least 1).
        free_bytes: the room the machine has now: a disk tier's filesystem free space, or a host
            tier's available RAM (or /dev/shm room, whichever is smaller).
        held_bytes: what kvstore holds there already (a disk tier's files; 0 for memory, lost at a restart).
        where: the folder or the memory the figures are of.
        rule: how `effective_bytes` follows from the figures (for the warning line).
    """

    kind: TierKind
    configured_bytes: int
    effective_bytes: int
    free_bytes: int
    held_bytes: int
    where: str
    rule: str

    def describe(self) -> str:
        """The one warning line: every figure, what the store does, and the fix."""
        held = f" and kvstore holds {format_bytes(self.held_bytes)} there" if self.held_bytes else ""
        return (f"tier {self.kind.value}: capacity {format_bytes(self.configured_bytes)} does not fit at this restart: "
                f"{self.where} has {format_bytes(self.free_bytes)} free{held}; starting with "
                f"{format_bytes(self.effective_bytes)} ({self.rule}); free room there or set "
                f"capacity to at most {format_bytes(self.effective_bytes)} to silence this")


def apply_caps(config: StoreConfig, caps: Iterable[CapacityCap]) -> StoreConfig:
    """`config` with each capped tier at its effective capacity (applying the same caps twice changes nothing)."""
    effective = {cap.kind: cap.effective_bytes for cap in caps}
    if not effective:
        return config
    tiers = tuple(dataclasses.replace(t, capacity_bytes=effective[t.kind]) if t.kind in effective else t
                  for t in config.tiers)
    return dataclasses.replace(config, tiers=tiers)
