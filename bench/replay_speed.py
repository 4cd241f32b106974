"""How fast `adaptive` decides next to LRU: replay throughput (block accesses/s) on the workload suite.

    kvstore bench replay_speed [--quick] [--json PATH]

Per workload (the suite's members that need no file), both policies replay each capacity 1, 5, 10
and 25% of the distinct blocks twice, in alternating order in one process, so machine load hits
both alike; the figure is adaptive's pooled blocks/s beside LRU's (issue 15's target: >= 0.5 x).
"""

from __future__ import annotations

from typing import Any

from bench.common import print_records, record
from kvstore.sim.replay import replay
from kvstore.sim.suite import workload_suite

CAPACITIES = (1.0, 5.0, 10.0, 25.0)


def _pooled_speed(trace: Any, capacities: tuple[float, ...], repeats: int) -> dict[str, float]:
    accesses = {"lru": 0, "adaptive": 0}
    wall = {"lru": 0.0, "adaptive": 0.0}
    for capacity in capacities:
        for rep in range(repeats):
            for policy in ("lru", "adaptive") if rep % 2 == 0 else ("adaptive", "lru"):
                result = replay(trace, policy, capacity)
                accesses[policy] += result.num_accesses
                wall[policy] += result.wall_s
    return {p: accesses[p] / wall[p] for p in accesses}


def run(quick: bool = False) -> list[dict[str, Any]]:
    members = [m for m in workload_suite() if not m.skip]
    if quick:
        members = members[:2]
    capacities = (5.0,) if quick else CAPACITIES
    records = []
    for member in members:
        speed = _pooled_speed(member.load(), capacities, repeats=1 if quick else 2)
        records.append(record(f"replay {member.name}: adaptive", speed["adaptive"], "blocks/s", "lru",
                              speed["lru"]))
    print_records("replay throughput: adaptive beside LRU (same process, alternating)", records)
    return records
