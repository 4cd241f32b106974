"""What a full tier does with a victim: evict it, or (by the compression policy) compress it in
place or drop it without demotion. EVICPRESS's compress-or-demote, applied by the Mover."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from kvstore.errors import KVStoreError
from kvstore.store.levels import Level

if TYPE_CHECKING:
    from kvstore.stats import Counters
    from kvstore.store.index import ChunkIndex
    from kvstore.store.layouts import LayoutSet
    from kvstore.types import ChunkMeta
    from policies.compression.policy import PressureDecision


class ReliefMover(Protocol):
    """What pressure relief needs from the store's mover (kvstore/store/mover.py)."""

    levels: list[Level]
    layouts: LayoutSet
    index: ChunkIndex
    stats: Counters

    def evict(self, level: Level, key: bytes, *, reason: str, demote: bool = True) -> bool: ...

    def raw_copy(self, level: Level, key: bytes, meta: ChunkMeta) -> torch.Tensor | None: ...

    def forget(self, level: Level, key: bytes) -> None: ...

    def warn_once(self, tag: str, msg: str, *args: object) -> None: ...


def plan_relief(mover: ReliefMover, level: Level, victims: list[bytes]) -> list[tuple[bytes, PressureDecision | None]]:
    """Victims with the compression policy's decision; compress-in-place candidates first, so
    a tier under pressure shrinks raw chunks before it evicts anything."""
    plan = [(key, pressure_decision(mover, level, key)) for key in victims]
    return sorted(plan, key=lambda kd: kd[1] is None or kd[1].action != "compress")


def relieve(mover: ReliefMover, level: Level, key: bytes, decision: PressureDecision | None) -> bool:
    """Free room held by one victim: evict it, or, when the compression policy says so,
    compress it in place or drop it without demotion."""
    if decision is None or decision.action == "demote":
        return mover.evict(level, key, reason="capacity")
    if decision.action == "compress" and compress_in_place(mover, level, key, decision.codec):
        return True
    return mover.evict(level, key, reason="capacity", demote=decision.action != "drop")


def pressure_decision(mover: ReliefMover, level: Level, key: bytes) -> PressureDecision | None:
    """The compression policy's PressureDecision for one victim, or None without a policy."""
    if level.compression is None:
        return None
    from policies.compression.policy import ChunkState
    from policies.compression.registry import codec_by_id

    state_now = mover.index.victim_state(key, level.index)
    if state_now is None:
        return None
    meta, has_lower_copy = state_now
    below = mover.levels[level.index + 1] if level.index + 1 < len(mover.levels) else None
    lower_bw = level.compression.read_bytes_per_s(below.name) if below is not None else None
    state = ChunkState(raw_bytes=meta.raw_bytes, stored_bytes=meta.stored_bytes, codec=codec_by_id(meta.codec_id).name,
                       has_lower_copy=has_lower_copy, lower_read_bytes_per_s=lower_bw, lower_write_bytes_per_s=lower_bw)
    return level.compression.on_pressure(level.name, state)


def compress_in_place(mover: ReliefMover, level: Level, key: bytes, codec_name: str | None) -> bool:
    """Re-encode a raw chunk with `codec_name` in the same tier; True when it freed bytes."""
    pinned = mover.index.pin_raw(level, key) if codec_name else None
    if pinned is None or not codec_name:
        return False
    entry, meta = pinned
    layout = mover.layouts.by_fingerprint(meta.layout_fingerprint)
    if layout is None:  # recovered, its model not registered since: the codec cannot know its shape
        mover.index.release(entry)
        return False
    try:
        raw = mover.raw_copy(level, key, meta)
        if raw is None:
            return False
        payload, new_meta = level.encode(raw, layout, key, codec=level.codec(codec_name))
        if level.tier.footprint(new_meta.stored_bytes) >= level.tier.footprint(meta.stored_bytes):
            return False
        level.tier.remove(key)
        level.tier.put(key, payload, new_meta)  # fits in the room the raw copy left
        mover.index.replace_meta(level, key, new_meta)  # re-added if a reader forgot it in between
        mover.stats.incr(f"{level.name}.compressed")
        return True
    except KVStoreError as exc:
        mover.warn_once(f"compress:{level.name}", "compress in place on %s failed: %s", level.name, exc)
        mover.forget(level, key)
        return True
    finally:
        mover.index.release(entry)
