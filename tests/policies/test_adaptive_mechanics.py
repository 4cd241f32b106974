"""`adaptive`'s speed mechanics change no decision: the twin shadow (at sampling rate 1 the driver
stands in for the leader's shadow until the first switch) hits and evicts exactly where a policy
running that shadow for real does, on a suite workload where the policy switches."""

from __future__ import annotations

from collections.abc import Container, Hashable

from kvstore.sim import replay as rp
from kvstore.sim.suite import load_replay_trace
from policies.eviction import AccessInfo
from policies.eviction._experts import EXPERTS
from policies.eviction.adaptive import AdaptiveEvictionPolicy


class _Recorder:
    """The replay's view of a policy, logging every victim list in order."""

    name = "adaptive"

    def __init__(self, inner: AdaptiveEvictionPolicy) -> None:
        self.inner = inner
        self.victim_lists: list[list[Hashable]] = []

    def on_insert(self, key: Hashable, info: AccessInfo) -> None:
        self.inner.on_insert(key, info)

    def on_access(self, key: Hashable, info: AccessInfo) -> None:
        self.inner.on_access(key, info)

    def on_remove(self, key: Hashable) -> None:
        self.inner.on_remove(key)

    def victims(self, n: int, pinned: Container[Hashable] = ()) -> list[Hashable]:
        out = self.inner.victims(n, pinned)
        self.victim_lists.append(out)
        return out

    def __len__(self) -> int:
        return len(self.inner)


def _replay(policy: AdaptiveEvictionPolicy, pct: float) -> tuple[int, list[list[Hashable]], int]:
    trace = load_replay_trace("gen:chat")
    recorder = _Recorder(policy)
    hits = rp._run(trace, recorder, None, rp.capacity_blocks_for(trace, pct), progress=False)[0]
    return hits, recorder.victim_lists, policy.switches


def test_the_twin_shadow_decides_as_a_real_shadow() -> None:
    capacity = rp.capacity_blocks_for(load_replay_trace("gen:chat"), 1.0)  # 53 blocks: every key sampled
    # S3-FIFO first beside the two plain hazard experts: on gen:chat at 1% the cache then switches (to
    # hazard), so the handover runs
    experts = ("lru", "s3fifo", "hazard-r", "hazard")
    twin = AdaptiveEvictionPolicy(capacity, experts, first="s3fifo", full_size=("lru",))  # S3-FIFO sampled: a twin
    real = AdaptiveEvictionPolicy(capacity, experts, first="s3fifo", full_size=("lru",))
    assert real._twin  # the default at rate 1; undone here by hand
    real._twin = False
    real._shadows[real._leader] = EXPERTS[real.mode](capacity)
    twin_run, real_run = _replay(twin, 1.0), _replay(real, 1.0)
    assert twin_run[2] >= 1  # the handover at a switch is exercised
    assert twin_run == real_run
    assert twin_run[0] > 0 and len(twin_run[1]) > 0
