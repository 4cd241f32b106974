"""`make_policy`: one tier's eviction and admission policies from a name, built in one place.

Construction contract (no signature sniffing): every registered eviction policy is built as
`cls(capacity=chunks)` (`None` when the size is unknown; policies that need no size ignore it),
every admission policy as `cls(capacity=chunks)`. `kvstore replay` builds its policies through
`with_admission` too (kvstore/sim/eviction), so a replay and a tier pair the same objects.

Admission: `EVICTION+ADMISSION` names the admission policy; without one, an eviction policy that
is itself an `AdmissionPolicy` (it learns from misses, as the replay-only `pace` does) decides admission, and any
other admits everything (`admission is None`).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.admission import AdmissionPolicy, make_admission_policy
from policies.eviction import EvictionPolicy, make_eviction_policy


@dataclass(frozen=True, slots=True)
class TierPolicy:
    """What governs one tier (or one simulated cache): who leaves, and who may enter."""

    eviction: EvictionPolicy
    admission: AdmissionPolicy | None  # None: admit everything

    @property
    def admission_is_eviction(self) -> bool:
        """The eviction policy decides admission too (it hears of evictions through `on_remove`)."""
        return self.admission is not None and self.admission is self.eviction  # type: ignore[comparison-overlap]


def make_policy(name: str, *, capacity: int | None) -> TierPolicy:
    """The policies named `EVICTION[+ADMISSION]` (e.g. `lru`, `adaptive`, `lru+ghost`) for `capacity` chunks.

    Raises:
        UnknownPolicyError: an unknown or replay-only eviction name, or an unknown admission name (the message
            lists the valid ones).
    """
    evict_name, _, admit_name = name.partition("+")
    return with_admission(make_eviction_policy(evict_name, capacity=capacity), admit_name, capacity=capacity)


def with_admission(eviction: EvictionPolicy, admit_name: str, *, capacity: int | None) -> TierPolicy:
    """`eviction` paired with the admission policy `admit_name` ("" for none: the eviction policy's own, if any)."""
    if admit_name:
        return TierPolicy(eviction, make_admission_policy(admit_name, capacity=capacity))
    if isinstance(eviction, AdmissionPolicy):
        return TierPolicy(eviction, eviction)
    return TierPolicy(eviction, None)
