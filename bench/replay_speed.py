"""How fast `adaptive` decides next to LRU: replay throughput (block accesses/s) on the workload suite.

    kvstore bench replay_speed [--quick] [--json PATH]

Per workload (every suite member: the trace files are looked up in ../shared/traces, or in the
folder KVSTORE_TRACES names, and skipped with a line when absent), both policies replay each capacity
1, 5, 10 and 25% of the distinct blocks three times, in alternating order in one process; each
capacity counts its fastest run per policy (other processes' load only ever slows a run), and the
figure is adaptive's pooled blocks/s beside LRU's (issue 15's target: >= 0.5 x).
Both run the same implementation (`policies.eviction._native`): the mypyc build of adaptive, its
experts, lru, arc and s3fifo that `pip install` made when it matches the sources, else pure Python (KVSTORE_PURE_PYTHON=1 forces it);
the metric names which.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.common import Record, print_records, record
from kvstore.sim.replay import replay
from kvstore.sim.suite import workload_suite
from kvstore.sim.trace import Trace
from policies.eviction import _native

CAPACITIES = (1.0, 5.0, 10.0, 25.0)


def _pooled_speed(trace: Trace, capacities: tuple[float, ...], repeats: int) -> dict[str, float]:
    """Per policy: block accesses over the summed best-of-`repeats` wall time of each capacity."""
    accesses = {"lru": 0, "adaptive": 0}
    wall = {"lru": 0.0, "adaptive": 0.0}
    for capacity in capacities:
        best: dict[str, float] = {}
        for rep in range(repeats):
            for policy in ("lru", "adaptive") if rep % 2 == 0 else ("adaptive", "lru"):
                result = replay(trace, policy, capacity)
                best[policy] = min(best.get(policy, result.wall_s), result.wall_s)
                num_accesses = result.num_accesses
        for policy in best:
            accesses[policy] += num_accesses
            wall[policy] += best[policy]
    return {p: accesses[p] / wall[p] for p in accesses}


def _trace_dir() -> Path:
    return Path(os.environ.get("KVSTORE_TRACES") or Path(__file__).resolve().parents[2] / "shared" / "traces")


def run(quick: bool = False) -> list[Record]:
    members = workload_suite(_trace_dir())
    for member in members:
        if member.skip:
            print(f"skipped {member.name}: {member.skip}")
    members = [m for m in members if not m.skip]
    if quick:
        members = members[:2]
    capacities = (5.0,) if quick else CAPACITIES
    records = []
    for member in members:
        speed = _pooled_speed(member.load(), capacities, repeats=1 if quick else 3)
        impl = _native.IMPLEMENTATION
        records.append(record(f"replay {member.name}: adaptive ({impl})", speed["adaptive"], "blocks/s",
                              f"lru ({impl})", speed["lru"]))
    print_records(f"replay throughput: adaptive beside LRU (same process, alternating; {_native.IMPLEMENTATION})",
                  records)
    return records
