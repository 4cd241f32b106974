"""How far two correct S3-FIFOs differ per cell: the noise under issue 28's 0.3-point margin.

    kvstore bench classic_noise [--quick]                        seeds 0-5 of every family (--quick: seed 0 at 1%)
    python -m bench.classic_noise --seeds 0-32 [--families agent chat] [--capacities 1 5] [--processes 2]
        [--classic-cache PATH] [--json PATH]

The registered `s3fifo` plans its victims after a block is inserted. The S3-FIFO expert that
`adaptive` runs evicts before the insert. They are the same algorithm and differ only in that order.
Here the expert is fed the replay's requests as the registered policy sees them: every block, the
partly filled tail included, a request's blocks touched tail first, and each block a hit when it was
held before the request. So the difference per cell (same family, seed and capacity as
bench/adaptive_margin.py, same classic cache file) is what the order alone moves. It is printed
beside the margin that `adaptive` is held to.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
from pathlib import Path

from bench.adaptive_margin import CAPACITIES, SEEDS, _cache_key, cell_arguments, workloads_for
from bench.common import Record, record
from kvstore.sim.generators import GENERATORS
from kvstore.sim.replay import capacity_blocks_for, replay
from kvstore.sim.suite import load_replay_trace
from kvstore.sim.suite_cli import MARGIN_POINTS
from kvstore.sim.trace import Trace
from policies.eviction._experts import S3FIFOExpert


def expert_hit_rate(trace: Trace, pct: float) -> float:
    """Block hit rate (%) of the S3-FIFO expert, fed every block in the replay's order."""
    expert = S3FIFOExpert(capacity_blocks_for(trace, pct))
    hits = accesses = 0
    for request in trace.requests:
        keys = request.block_ids
        hits += sum(key in expert for key in keys)
        accesses += len(keys)
        for key in reversed(keys):
            expert.access(key)
    return 100.0 * hits / max(1, accesses)


_CACHED: dict[str, list[float]] = {}  # the classic cache file's entries, shared with forked workers


def _job(job: tuple[str, float]) -> tuple[str, float, float, float]:
    workload, pct = job
    trace = load_replay_trace(workload)
    cached = _CACHED.get(_cache_key(workload, "s3fifo", pct))
    registered = cached[1] if cached else replay(trace, "s3fifo", pct).block_hit_rate * 100
    return workload, pct, expert_hit_rate(trace, pct), registered


def differences(workloads: list[str], capacities: tuple[float, ...], *, processes: int,
                classic_cache: Path | None = None) -> dict[tuple[str, float], tuple[float, float]]:
    """(workload, capacity) -> (the expert's hit rate, the registered S3-FIFO's), both in %; the registered
    one read from `classic_cache` where bench/adaptive_margin.py stored it, replayed otherwise."""
    _CACHED.clear()
    if classic_cache is not None and classic_cache.exists():
        _CACHED.update(json.loads(classic_cache.read_text()))
    jobs = [(w, c) for w in workloads for c in capacities]
    if processes <= 1:
        results = [_job(job) for job in jobs]
    else:
        with mp.get_context("fork").Pool(processes) as pool:
            results = pool.map(_job, jobs, chunksize=4)
    return {(w, c): (rate, registered) for w, c, rate, registered in results}


def summary(found: dict[tuple[str, float], tuple[float, float]]) -> tuple[str, list[Record]]:
    """Per capacity: mean and largest |difference|, its sd, and cells past the margin."""
    lines = [f"| capacity | cells | mean abs difference | sd | largest | cells over {MARGIN_POINTS} |",
             "|---:|---:|---:|---:|---|---:|"]
    records: list[Record] = []
    for pct in sorted({c for _, c in found}):
        diffs = {w: rate - reg for (w, c), (rate, reg) in found.items() if c == pct}
        n = len(diffs)
        mean = sum(diffs.values()) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs.values()) / n)
        mean_abs = sum(abs(d) for d in diffs.values()) / n
        worst = max(diffs, key=lambda w: abs(diffs[w]))
        over = sum(abs(d) > MARGIN_POINTS for d in diffs.values())
        lines.append(f"| {pct:g}% | {n} | {mean_abs:.3f} | {sd:.3f} | {worst} {diffs[worst]:+.2f} | {over} |")
        records.append(record(f"{pct:g}%: largest |S3-FIFO expert - registered S3-FIFO| over {n} cells",
                              abs(diffs[worst]), "points", "adaptive's margin", MARGIN_POINTS))
    return "\n".join(lines), records


def run(quick: bool = False) -> list[Record]:
    """`kvstore bench classic_noise`: seeds 0-5 of every family at 1/5/10/25% (--quick: seed 0 at 1%)."""
    found = differences(workloads_for(list(GENERATORS), (0,) if quick else SEEDS), (1.0,) if quick else CAPACITIES,
                        processes=os.cpu_count() or 1)
    text, records = summary(found)
    print(text)
    return records


def main(argv: list[str] | None = None) -> None:
    parser = cell_arguments(__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    found = differences(workloads_for(args.families, args.seeds), tuple(args.capacities), processes=args.processes,
                        classic_cache=args.classic_cache)
    text, records = summary(found)
    print(text)
    if args.json is not None:
        cells = {_cache_key(w, "s3fifo-expert", c): [rate, reg] for (w, c), (rate, reg) in found.items()}
        args.json.write_text(json.dumps({"records": records, "cells": cells}, indent=1) + "\n")


if __name__ == "__main__":
    main()
