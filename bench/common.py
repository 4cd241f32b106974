"""Shared benchmark helpers: records, timing, machine description, printed tables."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import TypedDict

from rich.console import Console
from rich.table import Table


class Record(TypedDict):
    """One result, the shape every suite shares (docs: STYLE.md, Benchmarks)."""

    metric: str
    value: float
    unit: str
    baseline: str
    baseline_value: float
    ratio: float


def require_extra(modules: tuple[str, ...], *, extra: str, what: str) -> None:
    """Exit with one line naming the extra to install when a module `what` needs does not import."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise SystemExit(f"{what} needs {name}, which comes with the {extra!r} extra: "
                             f"bash scripts/setup.sh {extra} (or pip install -e '.[{extra}]'), then rerun") from None


def record(metric: str, value: float, unit: str, baseline: str, baseline_value: float,
           ratio: float | None = None) -> Record:
    """One result in the shape every suite shares; ratio = value / baseline unless given."""
    if ratio is None:
        ratio = value / baseline_value if baseline_value else float("nan")
    return {"metric": metric, "value": round(value, 6), "unit": unit, "baseline": baseline,
            "baseline_value": round(baseline_value, 6), "ratio": round(ratio, 4)}


def best_time(fn: Callable[[], object], *, repeats: int, warmup: int = 1) -> float:
    """Median seconds of `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def machine_info() -> dict[str, object]:
    import torch

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],  # a shared machine: how busy it was
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def print_records(title: str, records: list[Record]) -> None:
    table = Table(title=title)
    for column in ("metric", "value", "unit", "baseline", "baseline value", "ratio"):
        table.add_column(column, justify="right" if column not in ("metric", "baseline") else "left")
    for r in records:
        table.add_row(r["metric"], f"{r['value']:.4g}", r["unit"], r["baseline"], f"{r['baseline_value']:.4g}",
                      f"{r['ratio']:.3f}")
    Console(width=max(120, Console().width)).print(table)
