"""Replay a prefix-block trace through the store's eviction and admission policy objects.

The simulated tier holds `capacity` blocks. For each request (timestamp order) every block is
looked up first (hits are decided before anything changes), then touched tail first, head last,
as the store does: a hit calls `on_access`; a miss calls the admission's `on_miss`/`admit` and,
when admitted, the eviction policy's `on_insert`, after which the tier evicts `victims(...)` until
it fits again (insert-then-evict, so an offline policy such as MIN can bypass a block by
naming the block itself). Figures:

* block hit rate: hits / block accesses;
* prefix hit rate: hits inside each request's leading run of cached blocks / block accesses
  (what an engine can use: a hit after the first miss saves nothing);
* token hit rate: prompt tokens inside that leading run / prompt tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypedDict

from kvstore.errors import ConfigError
from kvstore.sim.eviction import is_offline, make_replay_policy
from kvstore.sim.trace import Trace, TraceRequest
from policies.admission import AdmissionPolicy
from policies.eviction import EvictionPolicy
from policies.eviction.base import AccessInfo

logger = logging.getLogger(__name__)


class ReplayRecord(TypedDict):
    """A replay as `kvstore replay --json` writes it."""

    trace: str
    policy: str
    capacity_pct: float
    block_hit_rate: float
    prefix_hit_rate: float
    token_hit_rate: float
    blocks_per_s: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """Hit rates of one policy at one capacity on one trace."""

    trace: str
    policy: str
    capacity_pct: float
    capacity_blocks: int
    block_hit_rate: float
    prefix_hit_rate: float
    token_hit_rate: float
    num_accesses: int
    wall_s: float

    @property
    def blocks_per_s(self) -> float:
        """Replay throughput: block accesses decided per second of this replay."""
        return self.num_accesses / self.wall_s if self.wall_s > 0 else 0.0

    def to_record(self) -> ReplayRecord:
        return {"trace": self.trace, "policy": self.policy, "capacity_pct": self.capacity_pct,
                "block_hit_rate": self.block_hit_rate, "prefix_hit_rate": self.prefix_hit_rate,
                "token_hit_rate": self.token_hit_rate, "blocks_per_s": round(self.blocks_per_s)}


def access_sequence(trace: Trace) -> list[Hashable]:
    """Block keys in the order `replay` touches them (per request: tail first); MIN's future."""
    return [b for r in trace.requests for b in reversed(r.block_ids)]


def build_policies(name: str, capacity_blocks: int, trace: Trace) -> tuple[EvictionPolicy, AdmissionPolicy | None]:
    """The eviction and admission policies named `EVICTION[+ADMISSION]` (e.g. `lru+ghost`): a tier policy built
    exactly as the store builds a tier's, or a replay-only one (kvstore/sim/eviction); `min` is given the
    trace's future accesses."""
    future = access_sequence(trace) if is_offline(name.partition("+")[0]) else []
    policy = make_replay_policy(name, capacity=capacity_blocks, future=future)
    return policy.eviction, policy.admission


def capacity_blocks_for(trace: Trace, capacity_pct: float) -> int:
    if not 0 < capacity_pct <= 100:
        raise ConfigError(f"capacity must be a percentage in (0, 100], got {capacity_pct}")
    return max(1, round(trace.num_distinct_blocks * capacity_pct / 100))


def replay(trace: Trace, policy: str, capacity_pct: float, *, progress: bool = False) -> ReplayResult:
    """Replay `trace` through the policy named `policy` with room for `capacity_pct`% of its blocks."""
    capacity = capacity_blocks_for(trace, capacity_pct)
    evict, admit = build_policies(policy, capacity, trace)
    start = time.perf_counter()
    counts = _run(trace, evict, admit, capacity, progress=progress)
    wall_s = time.perf_counter() - start
    hits, prefix_hits, prefix_tokens, accesses, tokens = counts
    return ReplayResult(
        trace=trace.name, policy=policy, capacity_pct=capacity_pct, capacity_blocks=capacity,
        block_hit_rate=hits / max(1, accesses), prefix_hit_rate=prefix_hits / max(1, accesses),
        token_hit_rate=prefix_tokens / max(1, tokens), num_accesses=accesses, wall_s=wall_s,
    )


def _run(trace: Trace, evict: EvictionPolicy, admit: AdmissionPolicy | None, capacity: int, *,
         progress: bool) -> tuple[int, ...]:
    resident: set[Hashable] = set()
    hits = prefix_hits = prefix_tokens = accesses = tokens = 0
    block_tokens = trace.block_tokens
    requests = trace.requests
    if progress:
        from tqdm import tqdm

        requests = tqdm(requests, desc=f"{evict.name} @ {capacity} blocks", unit="req", leave=False)
    for req in requests:
        keys = req.block_ids
        hit = [k in resident for k in keys]
        run = hit.index(False) if False in hit else len(hit)
        hits += sum(hit)
        prefix_hits += run
        accesses += len(keys)
        tokens += req.input_tokens
        prefix_tokens += min(req.input_tokens, run * block_tokens)
        _touch_request(req, keys, hit, resident, evict, admit, capacity, block_tokens)
    return hits, prefix_hits, prefix_tokens, accesses, tokens


def _touch_request(req: TraceRequest, keys: tuple[int, ...], hit: list[bool], resident: set[Hashable],
                   evict: EvictionPolicy, admit: AdmissionPolicy | None, capacity: int, block_tokens: int) -> None:
    num = len(keys)
    request_hit = bool(hit) and hit[0]
    root = keys[0] if keys else None
    for i in range(num - 1, -1, -1):
        key = keys[i]
        info = AccessInfo(position=i, parent=keys[i - 1] if i else None, request_hit=request_hit, root=root,
                          chain_chunks=num, is_partial=req.input_tokens < (i + 1) * block_tokens)
        if key in resident:
            evict.on_access(key, info)
            continue
        if admit is not None:
            admit.on_miss(key, info)
            if not admit.admit(key, info):
                continue
        evict.on_insert(key, info)
        resident.add(key)
        if len(resident) > capacity:
            for victim in evict.victims(len(resident) - capacity):
                resident.discard(victim)
                evict.on_remove(victim)
                if admit is not None:
                    admit.on_evict(victim)


_WORKER_TRACE: Trace | None = None


def _replay_job(job: tuple[str, float]) -> ReplayResult:
    assert _WORKER_TRACE is not None
    return replay(_WORKER_TRACE, job[0], job[1])


def replay_many(trace: Trace, policies: list[str], capacities: list[float], *, processes: int | None = None,
                progress: bool = True) -> list[ReplayResult]:
    """Every (policy, capacity) pair, in parallel processes (fork shares the loaded trace).

    Results come back in (policy, capacity) order. Unknown names fail before any work starts.
    """
    import multiprocessing as mp
    import os

    global _WORKER_TRACE
    for name in policies:
        build_policies(name, 1, trace.head(0))  # validate names (raises UnknownPolicyError)
    jobs = [(p, c) for p in policies for c in capacities]
    for _, c in jobs:
        capacity_blocks_for(trace, c)
    processes = processes or min(len(jobs), os.cpu_count() or 1)
    _WORKER_TRACE = trace
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc="replay", unit="run", leave=False)
    results: dict[tuple[str, float], ReplayResult] = {}
    try:
        if processes <= 1 or "fork" not in mp.get_all_start_methods():
            for job in jobs:
                results[job] = _replay_job(job)
                if bar is not None:
                    bar.update()
        else:
            # heaviest first (min, pace) so the pool's tail is short
            order = sorted(jobs, key=lambda j: j[0] not in ("min", "pace"))
            with mp.get_context("fork").Pool(processes) as pool:
                for result in pool.imap_unordered(_replay_job, order):
                    results[(result.policy, result.capacity_pct)] = result
                    if bar is not None:
                        bar.update()
    finally:
        _WORKER_TRACE = None
        if bar is not None:
            bar.close()
    return [results[job] for job in jobs]
