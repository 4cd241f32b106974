"""`LRUGuard`: a key-only shadow LRU beside an eviction policy, and the test that says when to
follow LRU instead (used by PACE; docs/pace.md says why and how it was tuned).

Per request (a request's blocks hit or miss together, so the request, not the block, is the
independent sample) the lead is the shadow's hits minus the policy's. Decayed sums of the leads
and of their squares over about LRU_WINDOW horizons of touches give a self-normalised test; when
the lead exceeds LRU_LEAD_Z standard errors the policy follows LRU for LRU_STINT horizons, then
starts a fresh window (while it follows LRU the shadow and the cache agree: nothing to compare).
Memory: at most `capacity` keys, like a ghost list.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

LRU_LEAD_Z = 2.0  # follow LRU once the shadow LRU leads by this many standard errors ...
LRU_WINDOW = 1.0  # ... over a decayed window of this many horizons (cache turnovers) of touches,
LRU_STINT = 0.5  # for this many horizons; then the policy again, with a fresh window


class LRUGuard:
    def __init__(self) -> None:
        self._shadow: OrderedDict[Hashable, None] = OrderedDict()
        self._request_lead = 0  # this request's shadow-LRU hits minus the policy's
        self._request_touches = 0
        self._lead = 0.0  # decayed sum of per-request leads ...
        self._lead_sq = 0.0  # ... and of their squares (the variance of that sum)
        self._until = -1  # logical time until which the cache follows LRU

    def following(self, now: int) -> bool:
        """Whether the cache should act as LRU at logical time `now` (evict the oldest, admit all)."""
        return now < self._until

    def touch(self, key: Hashable, hit: bool, capacity: int) -> None:
        """Touch `key` in the shadow (holding `capacity` keys); count its hit against the policy's."""
        shadow = self._shadow
        if key in shadow:
            shadow.move_to_end(key)
            self._request_lead += not hit
        else:
            shadow[key] = None
            self._request_lead -= hit
            while len(shadow) > capacity:
                shadow.popitem(last=False)
        self._request_touches += 1

    def close_request(self, now: int, horizon: float) -> None:
        """One request is done: update the test; start an LRU stint when the lead is significant."""
        lead, touches = self._request_lead, self._request_touches
        self._request_lead = self._request_touches = 0
        if now < self._until:
            return
        keep = max(0.0, 1.0 - touches / (LRU_WINDOW * horizon))
        self._lead = self._lead * keep + lead
        self._lead_sq = self._lead_sq * keep + lead * lead
        if self._lead > 0 and self._lead * self._lead > LRU_LEAD_Z * LRU_LEAD_Z * self._lead_sq:
            self._until = now + int(LRU_STINT * horizon)
            self._lead = self._lead_sq = 0.0
