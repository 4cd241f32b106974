"""`make_policy`: one tier's eviction and admission policies from a name, built in one place.

Construction contract (no signature sniffing): every registered eviction policy is built as
`cls(capacity=chunks)` (`None` when the size is unknown; policies that need no size ignore it),
every admission policy as `cls(capacity=chunks)`. Offline policies (`min`, registered with
`register_offline_eviction_policy`) are built as `cls(capacity=chunks, future=accesses)`.

Admission: `EVICTION+ADMISSION` names the admission policy; without one, an eviction policy that
is itself an `AdmissionPolicy` (it learns from misses, e.g. `pace`) decides admission, and any
other admits everything (`admission is None`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from policies.admission import AdmissionPolicy, make_admission_policy
from policies.eviction import EvictionPolicy, make_eviction_policy
from policies.eviction.registry import is_offline


@dataclass(frozen=True, slots=True)
class TierPolicy:
    """What governs one tier (or one simulated cache): who leaves, and who may enter."""

    eviction: EvictionPolicy
    admission: AdmissionPolicy | None  # None: admit everything

    @property
    def admission_is_eviction(self) -> bool:
        """The eviction policy decides admission too (it hears of evictions through `on_remove`)."""
        return self.admission is not None and self.admission is self.eviction  # type: ignore[comparison-overlap]


def make_policy(name: str, *, capacity: int | None, future: Sequence[Hashable] = ()) -> TierPolicy:
    """The policies named `EVICTION[+ADMISSION]` (e.g. `lru`, `pace`, `lru+ghost`) for `capacity` chunks.

    `future` is the access sequence, given to offline policies (`min`) only.

    Raises:
        UnknownPolicyError: an unknown eviction or admission name (the message lists the valid ones).
    """
    evict_name, _, admit_name = name.partition("+")
    if is_offline(evict_name):
        eviction = make_eviction_policy(evict_name, capacity=capacity, future=list(future))
    else:
        eviction = make_eviction_policy(evict_name, capacity=capacity)
    if admit_name:
        return TierPolicy(eviction, make_admission_policy(admit_name, capacity=capacity))
    if isinstance(eviction, AdmissionPolicy):
        return TierPolicy(eviction, eviction)
    return TierPolicy(eviction, None)
