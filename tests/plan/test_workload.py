"""Workloads become block-id traces: the parametric model, the Azure reuse model, Mooncake, working set."""

from __future__ import annotations

import json
from pathlib import Path

from kvstore.plan.inputs import WorkloadParams
from kvstore.plan.workload import parametric_trace, trace_stats, working_set
from kvstore.sim.trace_files import load_azure_csv, load_trace

from .conftest import make_trace


def test_second_turn_extends_the_first() -> None:
    trace = parametric_trace(WorkloadParams(sessions=1, turns=2, prompt_tokens=1024, output_tokens=0, repeat_share=0.0),
                             block_tokens=512)
    first, second = (r.block_ids for r in trace.requests)
    assert len(first) == 2 and len(second) == 4
    assert second[:2] == first and len(set(second)) == 4
    assert [r.input_tokens for r in trace.requests] == [1024, 2048]


def test_system_prompt_is_shared_across_sessions_and_partial_blocks_are_fresh() -> None:
    # repeat_share 0.5 of 1024 tokens = 512 system tokens = block 0 of every session.
    params = WorkloadParams(sessions=3, turns=1, prompt_tokens=1024, output_tokens=0, repeat_share=0.5, rps=2.0)
    trace = parametric_trace(params, block_tokens=512)
    heads = {r.block_ids[0] for r in trace.requests}
    seconds = {r.block_ids[1] for r in trace.requests}
    assert len(heads) == 1 and len(seconds) == 3
    assert [r.timestamp for r in trace.requests] == [0.0, 500.0, 1000.0]  # ms at 2 req/s
    odd = parametric_trace(WorkloadParams(sessions=2, turns=1, prompt_tokens=700, repeat_share=0.0), block_tokens=512)
    assert odd.requests[0].block_ids[1] != odd.requests[1].block_ids[1]  # 188-token tails never shared


def test_azure_reuse_model(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.0000000,1024,10\n"
                    "2023-11-16 18:15:47.5000000,2048,10\n"
                    "2023-11-16 18:15:48.0000000,600,10\n")
    # One session, everything repeats: request 2 shares floor(2048/256)=8 blocks but request 1 had 4;
    # request 3 shares floor(600/256) = 2 of request 2's.
    trace = load_azure_csv(path, block_tokens=256, sessions=1, repeat_share=1.0)
    r1, r2, r3 = (r.block_ids for r in trace.requests)
    assert r2[:4] == r1 and len(set(r2[4:]) & set(r1)) == 0 and len(r2) == 8
    assert r3[:2] == r2[:2] and len(r3) == 3 and r3[2] not in r2
    assert [r.timestamp for r in trace.requests] == [0.0, 1500.0, 2000.0]
    none = load_azure_csv(path, block_tokens=256, sessions=1, repeat_share=0.0)
    assert trace_stats(none).num_distinct_blocks == 4 + 8 + 3


def test_mooncake_stats(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 2000, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    trace, note = load_trace(path, block_tokens=256)
    stats = trace_stats(trace)
    assert "Mooncake" in note and trace.block_tokens == 512
    assert (stats.num_requests, stats.duration_s, stats.rps, stats.mean_prompt_tokens) == (2, 2.0, 1.0, 800.0)
    assert (stats.num_accesses, stats.num_distinct_blocks) == (4, 3)


def test_working_set_per_window() -> None:
    trace = make_trace([(1, 2), (1, 3), (4,), (4, 5)])  # at 0, 1, 2, 3 s
    rows = working_set(trace, block_bytes=100, num_windows=2)
    assert [r["window_blocks"] for r in rows] == [3, 2]
    assert [r["cumulative_bytes"] for r in rows] == [300, 500]
