"""bench/classic_noise.py feeds the S3-FIFO expert exactly as the replay feeds a policy, so the
difference it prints is the eviction order's alone, and its summary reports the cells it was given."""

from __future__ import annotations

import pytest

from bench.classic_noise import expert_hit_rate, summary
from kvstore.sim.generators import BLOCK_TOKENS, generate, rows_to_trace
from kvstore.sim.replay import _run, capacity_blocks_for
from kvstore.sim.suite_cli import MARGIN_POINTS
from policies.eviction import make_eviction_policy


@pytest.mark.parametrize("pct", [1.0, 10.0])
def test_the_expert_scores_what_adaptive_on_that_expert_alone_scores_when_no_block_is_partial(pct: float) -> None:
    """With every prompt a whole number of blocks, the expert refuses nothing, so it must score what a
    replay of `adaptive` following only that expert scores: same order of touches, same hit counting."""
    rows = generate("agent", seed=3)[:1500]
    for row in rows:
        row["input_length"] = len(row["hash_ids"]) * BLOCK_TOKENS
    trace = rows_to_trace("agent-whole", rows)
    capacity = capacity_blocks_for(trace, pct)
    policy = make_eviction_policy("adaptive", capacity=capacity, experts=("s3fifo",), first="s3fifo")
    hits, _, _, accesses, _ = _run(trace, policy, None, capacity, progress=False)
    replayed = 100.0 * hits / accesses
    assert expert_hit_rate(trace, pct) == pytest.approx(replayed, abs=1e-9)


def test_summary_reports_each_capacity_its_largest_difference_and_the_cells_past_the_margin() -> None:
    found = {("gen:a:0", 1.0): (40.0, 40.5), ("gen:a:1", 1.0): (41.0, 40.9), ("gen:a:0", 5.0): (60.0, 60.0)}
    text, records = summary(found)
    assert "| 1% | 2 | 0.300 |" in text and "gen:a:0 -0.50 | 1 |" in text
    assert "| 5% | 1 | 0.000 |" in text
    assert [r["value"] for r in records] == [0.5, 0.0]
    assert all(r["baseline_value"] == MARGIN_POINTS for r in records)
