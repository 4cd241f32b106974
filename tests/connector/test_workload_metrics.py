"""Workload builder (Azure trace scaled, shared system prompts, follow-ups) and run metrics arithmetic."""

from __future__ import annotations

import math

from connector.engine.metrics import RunMetrics, percentile
from connector.engine.sequence import Sequence
from connector.engine.workload import (
    TraceRow,
    WorkloadConfig,
    build_workload,
    default_trace_dir,
    load_azure_conv,
    spread_rows,
)


def rows(n: int) -> list[TraceRow]:
    return [TraceRow(arrival_s=10.0 * i, context_tokens=400 + 40 * i, generated_tokens=100) for i in range(n)]


def test_arrivals_are_rescaled_to_the_requested_rate_and_lengths_clipped() -> None:
    config = WorkloadConfig(num_requests=9, requests_per_s=3.0, length_scale=0.5, max_user_tokens=220,
                            max_output_tokens=30, system_prompt_tokens=32, follow_up_prob=0.0)
    reqs = build_workload(rows(9), config)
    assert [round(r.arrival_s, 6) for r in reqs] == [round(i * 3.0 / 8, 6) for i in range(9)]  # 9 req in 3 s
    assert [len(r.prompt_token_ids) - 32 for r in reqs] == [min(220, (400 + 40 * i) // 2) for i in range(9)]
    assert all(r.sampling.max_tokens == 30 for r in reqs)


def test_system_prompts_are_shared_and_follow_ups_extend_a_conversation() -> None:
    config = WorkloadConfig(num_requests=30, num_system_prompts=2, system_prompt_tokens=16, follow_up_prob=0.5)
    reqs = build_workload(rows(30), config)
    heads = {tuple(r.prompt_token_ids[:16]) for r in reqs}
    assert len(heads) == 2
    prompts = [r.prompt_token_ids for r in reqs]
    follow_ups = [p for i, p in enumerate(prompts) if any(len(q) < len(p) and p[: len(q)] == q for q in prompts[:i])]
    assert len(follow_ups) >= 8  # each one's prefix is an earlier prompt, so the store can serve it


def test_spread_rows_samples_evenly_over_the_whole_trace_in_order() -> None:
    trace = rows(100)
    picked = spread_rows(trace, 8)
    assert [r.context_tokens for r in picked] == [400 + 40 * i for i in (0, 12, 25, 37, 50, 62, 75, 87)]
    assert spread_rows(trace, 100) == trace and spread_rows(trace, 500) == trace
    reqs = build_workload(picked, WorkloadConfig(num_requests=8, requests_per_s=4.0))
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs) and reqs[-1].arrival_s == 2.0  # 8 requests at 4/s


def test_real_azure_trace_loads_when_present() -> None:
    if not (default_trace_dir() / "azure_conv_2023.csv").exists():
        return
    trace = load_azure_conv(num_rows=5)
    assert trace[0].arrival_s == 0.0 and trace[0].context_tokens == 374 and trace[0].generated_tokens == 44
    assert trace[4].arrival_s > trace[1].arrival_s


def test_percentiles_and_run_summary() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0 and math.isnan(percentile([], 50))
    seq = Sequence([1, 2, 3, 4], arrival_time=1.0, page_size=4)
    seq.admit_time = 1.5
    seq.num_pool_hit_tokens = 2
    for t, tok in ((2.0, 7), (2.5, 8), (3.5, 9)):
        seq.append_token(tok, t)
    seq.finish_time = 3.5
    metrics = RunMetrics(wall_s=5.0)
    metrics.add([seq])
    s = metrics.summary()
    assert (s["ttft_mean_s"], s["itl_p50_s"], s["e2e_p50_s"], s["max_wait_s"]) == (1.0, 0.75, 2.5, 0.5)
    assert s["output_tokens_per_s"] == 3 / 5.0 and s["kv_hit_rate"] == 0.5


def test_replay_on_a_compute_clock_skips_idle_gaps_and_reports_every_request() -> None:
    from connector.engine.llm_engine import LLMEngine, TimedRequest
    from connector.engine.metrics import ComputeClock
    from connector.engine.sequence import SamplingParams
    from tests.connector.conftest import engine_config, prompt

    clock = ComputeClock()
    engine = LLMEngine(engine_config(), clock=clock)
    requests = [TimedRequest(t, prompt(i, 20), SamplingParams(max_tokens=3)) for i, t in enumerate((0.0, 50.0, 100.0))]
    metrics = engine.replay(requests)
    summary = metrics.summary()
    assert summary["requests"] == 3 and summary["output_tokens"] == 9
    assert summary["wall_s"] >= 100.0  # the virtual clock jumped to the last arrival instead of sleeping
    assert all(0 <= r.ttft_s < 50.0 for r in metrics.requests)  # nobody waited for a later arrival
