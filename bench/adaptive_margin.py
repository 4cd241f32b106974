"""Issue 28's table: `adaptive` beside the best of LRU, ARC and S3-FIFO on every generated cell, the margin per cell.

    kvstore bench adaptive_margin [--quick] [--json PATH]     seeds 0-5 of every family (--quick: seed 0 at 1%)
    python -m bench.adaptive_margin --seeds 0-8 [--families agent mix] [--capacities 1 5] [--processes 2]
        [--classic-cache PATH] [--set LEAD_Z=2.5] [--json PATH]

A cell is one generator family, seed and capacity (% of the trace's distinct blocks); its gap is
adaptive's block hit rate minus max(LRU, ARC, S3-FIFO), in points, and a cell misses when the gap is
under -MARGIN_POINTS (kvstore/sim/suite_cli.py's check). Replays are `kvstore.sim.replay.replay`,
those of `kvstore replay gen:FAMILY:SEED --policy lru arc s3fifo adaptive --capacity 1 5 10 25`.
`--classic-cache` keeps the classics' hit rates in a JSON file (they do not depend on adaptive), so
a rerun replays adaptive alone; `--set NAME=VALUE` sets a module constant of
`policies.eviction.adaptive` before the replays (a variant, never the default). Both builds run
the same decisions; the build in use (`policies.eviction._native`) is printed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path

from bench.common import Record, record
from kvstore.sim.generators import GENERATORS
from kvstore.sim.replay import replay
from kvstore.sim.suite import load_replay_trace
from kvstore.sim.suite_cli import CLASSIC, MARGIN_POINTS
from kvstore.sim.trace import Trace
from policies.eviction import _native
from policies.eviction import adaptive as adaptive_module

CAPACITIES = (1.0, 5.0, 10.0, 25.0)
SEEDS = tuple(range(6))
POLICY = "adaptive"


@dataclass(frozen=True, slots=True)
class Cell:
    """One family, seed and capacity: every policy's block hit rate (%)."""

    workload: str
    capacity_pct: float
    capacity_blocks: int
    rates: dict[str, float]

    @property
    def best(self) -> str:
        return max(CLASSIC, key=lambda name: self.rates[name])

    @property
    def gap(self) -> float:
        return self.rates[POLICY] - self.rates[self.best]

    @property
    def is_miss(self) -> bool:
        return self.gap < -MARGIN_POINTS


_TRACES: dict[str, Trace] = {}


def _job(job: tuple[str, str, float]) -> tuple[str, str, float, int, float]:
    workload, policy, pct = job
    if workload not in _TRACES:
        _TRACES.clear()  # one trace at a time per worker: jobs come workload by workload
        _TRACES[workload] = load_replay_trace(workload)
    result = replay(_TRACES[workload], policy, pct)
    return workload, policy, pct, result.capacity_blocks, result.block_hit_rate * 100


def _cache_key(workload: str, policy: str, pct: float) -> str:
    return f"{workload}|{policy}|{pct:g}"


def measure(workloads: list[str], capacities: tuple[float, ...], *, processes: int,
            classic_cache: Path | None = None) -> list[Cell]:
    """Every cell of `workloads` x `capacities`, replayed in `processes` forked workers."""
    has_cache = classic_cache is not None and classic_cache.exists()
    cached: dict[str, list[float]] = json.loads(classic_cache.read_text()) if classic_cache and has_cache else {}
    jobs = [(w, p, c) for w in workloads for c in capacities for p in (*CLASSIC, POLICY)
            if p == POLICY or _cache_key(w, p, c) not in cached]
    found: dict[str, list[float]] = dict(cached)
    if processes <= 1:
        results = [_job(job) for job in jobs]
    else:
        with mp.get_context("fork").Pool(processes) as pool:
            results = list(pool.imap_unordered(_job, jobs))
    for workload, policy, pct, blocks, rate in results:
        found[_cache_key(workload, policy, pct)] = [blocks, rate]
    if classic_cache is not None:
        classic_cache.write_text(json.dumps({k: v for k, v in found.items() if k.split("|")[1] in CLASSIC}, indent=1))
    cells = []
    for workload in workloads:
        for pct in capacities:
            rates = {p: found[_cache_key(workload, p, pct)][1] for p in (*CLASSIC, POLICY)}
            cells.append(Cell(workload, pct, int(found[_cache_key(workload, POLICY, pct)][0]), rates))
    return cells


def table(cells: list[Cell]) -> str:
    """The Markdown table of docs/adaptive.md, a miss marked."""
    lines = ["| workload | cap | blocks | LRU | ARC | S3-FIFO | best | adaptive | gap |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for c in cells:
        mark = " **miss**" if c.is_miss else ""
        lines.append(f"| {c.workload} | {c.capacity_pct:g}% | {c.capacity_blocks} | {c.rates['lru']:.2f} | "
                     f"{c.rates['arc']:.2f} | {c.rates['s3fifo']:.2f} | {c.best} | {c.rates[POLICY]:.2f} | "
                     f"{c.gap:+.2f}{mark} |")
    return "\n".join(lines)


def summary(cells: list[Cell], worst: int = 5) -> str:
    """Misses, the worst cells and the mean gap, one line."""
    misses = sum(c.is_miss for c in cells)
    ranked = sorted(cells, key=lambda c: c.gap)[:worst]
    named = ", ".join(f"{c.workload} {c.capacity_pct:g}% {c.gap:+.2f}" for c in ranked)
    mean = sum(c.gap for c in cells) / max(1, len(cells))
    return (f"{len(cells) - misses} of {len(cells)} cells within {MARGIN_POINTS} points ({_native.IMPLEMENTATION}); "
            f"worst: {named}; mean gap {mean:+.3f}")


def to_records(cells: list[Cell]) -> list[Record]:
    return [record(f"{c.workload} {c.capacity_pct:g}%: {POLICY} block hit", c.rates[POLICY], "%",
                   f"{c.best} (best classic)", c.rates[c.best]) for c in cells]


def workloads_for(families: list[str], seeds: tuple[int, ...]) -> list[str]:
    unknown = [f for f in families if f not in GENERATORS]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; valid: {', '.join(GENERATORS)}")
    return [f"gen:{family}:{seed}" for seed in seeds for family in families]


def run(quick: bool = False) -> list[Record]:
    """`kvstore bench adaptive_margin`: seeds 0-5 of every family at 1/5/10/25% (--quick: seed 0 at 1%)."""
    workloads = workloads_for(list(GENERATORS), (0,) if quick else SEEDS)
    cells = measure(workloads, (1.0,) if quick else CAPACITIES, processes=os.cpu_count() or 1)
    print(table(cells))
    print(summary(cells))
    return to_records(cells)


def _seeds(text: str) -> tuple[int, ...]:
    first, _, last = text.partition("-")
    try:
        return tuple(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad seeds {text!r}; use N or FIRST-LAST, e.g. 0-5") from None


def _apply_settings(settings: list[str]) -> None:
    for setting in settings:
        name, _, value = setting.partition("=")
        if not value or not hasattr(adaptive_module, name):
            raise SystemExit(f"bad --set {setting!r}: use NAME=VALUE with a constant of policies/eviction/adaptive.py")
        setattr(adaptive_module, name, type(getattr(adaptive_module, name))(value))


def cell_arguments(description: str | None) -> argparse.ArgumentParser:
    """A parser with the options that choose the cells (also bench/classic_noise.py's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seeds", type=_seeds, default=SEEDS, help="N or FIRST-LAST (default 0-5)")
    parser.add_argument("--families", nargs="+", default=list(GENERATORS))
    parser.add_argument("--capacities", nargs="+", type=float, default=list(CAPACITIES))
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--classic-cache", type=Path, help="JSON file keeping the classics' hit rates between runs")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = cell_arguments(__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="an adaptive constant (a variant)")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args(argv)
    _apply_settings(args.set)
    cells = measure(workloads_for(args.families, args.seeds), tuple(args.capacities), processes=args.processes,
                    classic_cache=args.classic_cache)
    print(table(cells))
    print(summary(cells))
    if args.json is not None:
        args.json.write_text(json.dumps(to_records(cells), indent=2) + "\n")


if __name__ == "__main__":
    main()
