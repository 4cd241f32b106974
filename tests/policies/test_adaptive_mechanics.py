"""`adaptive`'s speed mechanics change no decision: the twin shadow (at sampling rate 1 the driver
stands in for the leader's shadow until the first switch) hits and evicts exactly where a policy
running that shadow for real does, on a suite workload where the policy switches; the full-size
experts, run once per request, hold at every close what they hold run access by access."""

from __future__ import annotations

from collections.abc import Container, Hashable
from typing import cast

from kvstore.sim import replay as rp
from kvstore.sim.suite import load_replay_trace
from policies.eviction import AccessInfo
from policies.eviction._experts import EXPERTS
from policies.eviction.adaptive import AdaptiveEvictionPolicy
from policies.eviction.base import EvictionPolicy
from tests.policies.conftest import drive, random_stream


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


def test_full_size_experts_run_a_request_at_its_close_as_they_would_access_by_access() -> None:
    """The full-size experts beside the driver take each request's keys when it closes (one pass each,
    their tables warm): at every request's close each one holds what the same expert run access by
    access holds, so their exact leads and a handover to them are unchanged."""
    trace = load_replay_trace("gen:mix")
    capacity = rp.capacity_blocks_for(trace, 10.0)  # 1,424 blocks: LRU and S3-FIFO at full size, hazard-a sampled
    policy = AdaptiveEvictionPolicy(capacity)
    alone = {name: EXPERTS[name](capacity) for name in ("lru", "s3fifo")}
    resident: set[Hashable] = set()
    compared = 0
    for request in trace.requests[:600]:
        keys = request.block_ids
        for i in range(len(keys) - 1, -1, -1):
            partial = request.input_tokens < (i + 1) * trace.block_tokens
            for expert in alone.values():
                expert.access(keys[i], partial)
        rp._touch_request(request, keys, [k in resident for k in keys], resident, cast(EvictionPolicy, policy),
                          None, capacity, trace.block_tokens)
        if policy.mode == "hazard-a":
            for j, expert in enumerate(policy._full):
                name = policy._names[policy._full_index[j]]
                assert list(expert.order()) == list(alone[name].order()), name
            assert not policy._full_keys  # nothing left over once the request closed
            compared += 1
    assert compared > 500


def test_the_only_full_size_expert_keeps_running_once_it_no_longer_drives() -> None:
    """Started on LRU, the one full-size expert here, the cache buffers nothing for it while it drives;
    after a switch to a sampled expert LRU must still see every access, or its lead, and a switch back to
    it, would rest on a stale cache."""
    capacity = 1024
    policy = AdaptiveEvictionPolicy(capacity, experts=("lru", "hazard"), first="lru")
    assert [policy._names[i] for i in policy._full_index] == ["lru"]
    alone = EXPERTS["lru"](capacity)
    stream = random_stream(3, length=6 * capacity, num_keys=3 * capacity)
    resident: set[Hashable] = set()
    drive(policy, stream[:3 * capacity], capacity, resident=resident)
    policy._switch(policy._names.index("hazard"))
    assert policy.mode == "hazard"
    drive(policy, stream[3 * capacity:], capacity, resident=resident)
    for key in stream:
        alone.access(key)
    assert list(policy._full[0].order()) == list(alone.order())
