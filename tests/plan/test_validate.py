"""`--validate` parts on real stores: hit rates equal replay; loads come back byte-identical."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.layout import KVLayout
from kvstore.plan.inputs import WorkloadParams
from kvstore.plan.validate import hit_rows, measure_load, run_validate, store_hit_rate
from kvstore.plan.workload import parametric_trace
from kvstore.sim.replay import replay

from .test_capacity import CHAINS, make_trace


def test_real_store_hit_rate_equals_replay(tmp_path: Path) -> None:
    # The hand-worked trace of test_capacity: LRU with 2 blocks hits A,B then A -> 3 of 7 block accesses.
    trace = make_trace(CHAINS)
    assert store_hit_rate(trace, 2, tmp_path) == 3 / 7 == replay(trace, "lru", 200 / 3).prefix_hit_rate


def test_chain_longer_than_the_tier_keeps_its_head_in_store_and_replay(tmp_path: Path) -> None:
    """Regression: TieredStore.put_many inserted chains head first, so a request longer than the
    tier evicted its own head and the next identical request missed from chunk 0 (store 0%,
    replay 30%). Both now insert tail first: chunks 1-3 stay, the repeat hits 3 of 5."""
    trace = make_trace([(1, 2, 3, 4, 5), (1, 2, 3, 4, 5)])
    assert store_hit_rate(trace, 3, tmp_path) == replay(trace, "lru", 60).prefix_hit_rate == 3 / 10


def test_planner_replay_and_store_agree_on_a_parametric_workload(tmp_path: Path) -> None:
    trace = parametric_trace(WorkloadParams(sessions=30, turns=3, prompt_tokens=64, output_tokens=16), block_tokens=16)
    for row in hit_rows(trace, (5.0, 20.0, 60.0), tmp_path):
        assert row["planned"] == row["replay"] == row["store"]


def test_measure_load_reads_back_identical_bytes(tmp_path: Path) -> None:
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="bfloat16", chunk_tokens=64)  # 64 KiB chunks
    calibration, measured = measure_load(tmp_path, layout, prompt_tokens=512, rounds=2)
    assert measured["identical"] == 1.0
    assert measured["nbytes"] == 8 * layout.chunk_bytes
    assert calibration.memcpy_gbps > 0 and calibration.odirect_read_gbps > 0
    cpu_gbps = 1 / (1 / calibration.checksum_gbps + 1 / calibration.memcpy_gbps)
    assert calibration.nvme_gbps == min(calibration.odirect_read_gbps, cpu_gbps)


@pytest.mark.slow
def test_full_validate_runs(tmp_path: Path) -> None:
    result = run_validate(json_path=tmp_path / "v.json")
    assert {r["tier"] for r in result["load"]} == {"host", "nvme"}
    # The default capacities exceed the longest request of the default trace, where store and replay agree.
    assert all(r["planned"] == r["replay"] == r["store"] for r in result["hit_rate"])
