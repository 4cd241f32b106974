"""`hazard-a` (`AgeBlendHazardExpert`): the hazard expert (_expert_hazard.py) with its age exponent learned
online from two twins (docs/adaptive.md, "The experts")."""

from __future__ import annotations

import math
from collections.abc import Container, Hashable, Iterable
from typing import ClassVar, Final

from policies.eviction._expert_base import SAMPLE_SCALE, hash_sample_bits, sample_bits
from policies.eviction._expert_hazard import HazardExpert

BLEND_SOFTNESS = 2.0  # hazard-a: age exponent = 1 / (1 + exp(-z / this)), z the twins' lead in standard errors
BLEND_WINDOW = 4.0  # hazard-a: the twins' lead decays over this many capacities of accesses ...
BLEND_MIN_WINDOW = 16384  # ... and at least this many
BLEND_SNAP = 0.01  # hazard-a: an alpha within this of 0 or 1 is taken as 0 or 1 (|z| over 9.2) ...
_SNAP_Z2: Final = (BLEND_SOFTNESS * math.log((1.0 - BLEND_SNAP) / BLEND_SNAP)) ** 2  # ... the z^2 where it is
BLEND_MIN_EVIDENCE = 16.0  # hazard-a keeps alpha 1 (the plain hazard expert) until its twins disagree this often (decayed)
TWIN_KEYS = 128  # hazard-a's twins run at full size under this many keys, else on a hash sample sized to it ...
TWIN_MIN_RATE = 1 / 16  # ... sampling at least this rate


class AgeBlendHazardExpert(HazardExpert):
    """The hazard expert with its age exponent learned online (`hazard-a`). Two twins run beside it:
    one ranks by rate / age (reuse distances spread evenly over the octaves: multi-turn chat), the
    other by rate alone (independent references: Zipf-popular documents). This one ranks by
    rate / age ** alpha, alpha = 1 / (1 + exp(-z / BLEND_SOFTNESS)), z the decayed lead of the first
    twin's hits over the second's in standard errors: where one model holds it follows that twin, in
    between it lands between them (docs/adaptive.md). Until the twins have disagreed on
    BLEND_MIN_EVIDENCE accesses (decayed) alpha stays 1: a cold cache evicts as the plain hazard
    expert does (oldest first among equal rates), not its newest keys. Under TWIN_KEYS keys the twins run at
    full size; above, on a spatial hash sample of the keys in a cache scaled by the same rate (SHARDS),
    so they cost a fraction of this expert. A shadow of `adaptive` (`sample_keys`) stands for the whole
    cache: its twins run on the keys the whole cache's twins would."""

    name: ClassVar[str] = "hazard-a"

    def __init__(self, capacity: int, ghost_factor: float = 2.0) -> None:
        self.key_rate = 1.0  # the share of the cache's keys this expert sees (a shadow of a sample: below 1)
        self.log_uniform = HazardExpert(capacity, ghost_factor)  # alpha 1
        self.independent = HazardExpert(capacity, ghost_factor)
        self.independent.alpha = 0.0
        self.lead = 0.0  # decayed hits of log_uniform minus independent ...
        self.lead_sq = 1.0  # ... and their squares (1: no lead is significant before there is data)
        self._threshold = SAMPLE_SCALE
        self.twin_rate = 1.0  # the share of keys the twins see
        super().__init__(capacity, ghost_factor)

    def resize(self, capacity: int) -> None:
        super().resize(capacity)
        whole = self.capacity / self.key_rate  # the cache this expert stands for
        rate = 1.0 if whole < TWIN_KEYS else max(TWIN_MIN_RATE, TWIN_KEYS / whole)  # of the cache's keys
        # a shadow's twins see the keys the cache's own twins would (the same hash): all of its own, or fewer
        self._threshold = threshold = int(rate * SAMPLE_SCALE) if rate < self.key_rate else SAMPLE_SCALE
        self.twin_rate = min(1.0, threshold / SAMPLE_SCALE / self.key_rate)  # of this expert's keys
        twin = max(1, round(self.capacity * self.twin_rate))
        self.log_uniform.resize(twin)
        self.independent.resize(twin)
        per_cache = self.twin_rate * self.key_rate  # twin accesses per access of the cache
        self._keep = 1.0 - 1.0 / max(BLEND_MIN_WINDOW * per_cache, BLEND_WINDOW * twin)  # per sampled access

    def sample_keys(self, key_rate: float) -> None:
        """Make this expert a shadow that sees `key_rate` of the cache's keys (a hash sample at that
        rate, in a cache scaled by it): its twins then run on the keys a full-size hazard-a's twins
        would (the same hash, so a subset of this shadow's keys), at the same size and window."""
        self.key_rate = key_rate
        self.resize(self.capacity)

    def sampled(self, key: Hashable) -> bool:
        """Whether the twins see `key`."""
        return self._threshold >= SAMPLE_SCALE or sample_bits(key) < self._threshold

    def sampled_hash(self, key_hash: int) -> bool:
        """Whether the twins see the key whose hash is `key_hash`."""
        return self._threshold >= SAMPLE_SCALE or hash_sample_bits(key_hash) < self._threshold

    def access(self, key: Hashable, partial: bool = False) -> bool:
        if self._threshold >= SAMPLE_SCALE or sample_bits(key) < self._threshold:  # `sampled`, inlined: every access
            d = float(self.log_uniform.access(key, partial)) - float(self.independent.access(key, partial))
            keep = self._keep
            self.lead = self.lead * keep + d
            self.lead_sq = self.lead_sq * keep + d * d
        return super().access(key, partial)

    def _evict(self, now: int) -> None:
        lead, lead_sq = self.lead, self.lead_sq
        if lead_sq < BLEND_MIN_EVIDENCE:  # no evidence yet: the log-uniform model, as the plain expert
            self.alpha = 1.0
        elif lead * lead > _SNAP_Z2 * lead_sq:  # alpha within BLEND_SNAP of a model: that model, no power to take
            self.alpha = 1.0 if lead > 0.0 else 0.0
        else:
            self.alpha = 1.0 / (1.0 + math.exp(-lead / math.sqrt(lead_sq) / BLEND_SOFTNESS))
        super()._evict(now)

    def seed(self, keys: Iterable[Hashable], reused: Container[Hashable] = ()) -> None:
        keys = list(keys)
        super().seed(keys, reused)
        twin_keys = [key for key in keys if self.sampled(key)]
        self.log_uniform.seed(twin_keys, reused)
        self.independent.seed(twin_keys, reused)

    def take_classes(self, old: HazardExpert, resident: Container[Hashable],
                     ghost_keys: Container[int] | None = None, time_scale: float = 1.0) -> None:
        """As HazardExpert's; the twins take `old`'s twins when it has them: all that they hold and
        remember on this expert's twin sample, as a twin is a cache of its own, not a part of the resident
        keys. Else they take `old`'s sampled keys. (The twins' clocks count only the keys they sample.)"""
        super().take_classes(old, resident, ghost_keys, time_scale)
        if isinstance(old, AgeBlendHazardExpert):
            scale = time_scale * self.twin_rate / old.twin_rate
            for mine, theirs in ((self.log_uniform, old.log_uniform), (self.independent, old.independent)):
                held = {key for key in theirs.order() if self.sampled(key)}
                remembered = {h for h in theirs.ghost_hashes() if self.sampled_hash(h)}
                mine.take_classes(theirs, held, remembered, scale)
        else:
            sampled = {key for key in old.order() if key in resident and self.sampled(key)}
            twin_ghost = {h for h in old.ghost_hashes() if self.sampled_hash(h) and (ghost_keys is None or h in ghost_keys)}
            self.log_uniform.take_classes(old, sampled, twin_ghost, time_scale * self.twin_rate)
            self.independent.take_classes(old, sampled, twin_ghost, time_scale * self.twin_rate)

    def take_rates(self, source: HazardExpert, scale: float) -> None:
        """As HazardExpert's; from another hazard-a, the twins' rates and their lead too."""
        super().take_rates(source, scale)
        if isinstance(source, AgeBlendHazardExpert):
            self.log_uniform.take_rates(source.log_uniform, scale)
            self.independent.take_rates(source.independent, scale)
            self.lead, self.lead_sq = source.lead, source.lead_sq
