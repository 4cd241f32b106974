"""Smoke runs of the engine demo and `bench engine --quick` (slow: they replay real workloads)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from connector.engine.workload import AZURE_CONV, default_trace_dir

needs_trace = pytest.mark.skipif(not (default_trace_dir() / AZURE_CONV).exists(), reason="Azure trace not present")


@pytest.mark.slow
@needs_trace
def test_engine_demo_runs_rounds_of_three_passes_and_the_warm_store_hits(tmp_path: Path) -> None:
    from kvstore.cli.demo_run import print_results, run_engine_demo

    console = Console(file=io.StringIO(), width=160)
    results = run_engine_demo(num_requests=8, requests_per_s=20.0, num_blocks=128, trace=None,
                              store_dir=tmp_path, console=console, rounds=2)
    assert len(results) == 2
    for passes in results:
        assert list(passes) == ["no store", "store (cold)", "store (warm, restart)"]
        assert all(r["requests"] == 8 for r in passes.values())
        assert passes["no store"]["store_hit_rate"] == 0 and passes["store (warm, restart)"]["store_hit_rate"] > 0
    print_results(results, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "TTFT P99" in text and "M parameters" in text and "median of 2 rounds" in text
    assert "cold store" in text and "%" in text


@pytest.mark.slow
@needs_trace
def test_bench_engine_quick_emits_the_required_records() -> None:
    from bench.engine import run

    records = {r["metric"]: r for r in run(quick=True)}
    for metric in ("engine.continuous_vs_static", "engine.ttft.host", "engine.ttft.nvme", "engine.continuous_vs_dynamic",
                   "engine.policy.quota.long_max_wait", "engine.gather.torch", "engine.scatter.torch"):
        assert metric in records
    for r in records.values():
        assert set(r) == {"metric", "value", "unit", "baseline", "baseline_value", "ratio"}


def test_step_cost_measures_a_decode_step_at_the_asked_batch() -> None:
    from bench.step_cost import step_ms
    from tests.connector.conftest import MODEL

    ms = step_ms(MODEL, batch=3, context=20, steps=2, repeats=2)  # raises unless each step decoded all 3
    assert 0 < ms < float("inf")
