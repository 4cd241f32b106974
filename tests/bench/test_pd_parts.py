"""The parts of `kvstore bench pd` that run without vLLM: the mixed workload's requests, the summary of what
came back (TTFT per kind, TPOT and the longest inter-token gap of the decoding requests), and the records."""

from __future__ import annotations

import math

from bench.pd import FULL, QUICK, Run, _records
from bench.pd_workload import LONG, SHORT, make_requests, summarize
from bench.vllm_server import Completion


def test_requests_arrive_in_order_long_ones_while_short_ones_decode() -> None:
    requests = make_requests(FULL, seed=0)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    short = [r for r in requests if r.kind == SHORT]
    long = [r for r in requests if r.kind == LONG]
    assert len(short) == FULL.num_short and len(long) == FULL.num_long
    assert all(len(r.prompt) == FULL.long_tokens for r in long) and all(r.max_tokens == FULL.short_answer_tokens for r in short)
    assert min(r.arrival_s for r in long) > min(r.arrival_s for r in short)
    assert len({tuple(r.prompt[:16]) for r in requests}) == len(requests), "no prompt shares a prefix"
    assert make_requests(QUICK, seed=1)[0].prompt != make_requests(QUICK, seed=0)[0].prompt


def _done(ttft_s: float, times_s: list[float]) -> Completion:
    return Completion(token_ids=list(range(len(times_s))), num_prompt_tokens=10, num_cached_tokens=0, ttft_s=ttft_s,
                      latency_s=times_s[-1], token_times_s=times_s)


def test_summary_times_each_kind_and_finds_the_longest_gap_between_tokens() -> None:
    requests = make_requests(QUICK, seed=0)
    done: list[Completion | None] = []
    for r in requests:
        done.append(_done(0.5, [0.5, 0.6, 1.6, 1.7]) if r.kind == SHORT else _done(2.0, [2.0, 2.1]))
    done[-1] = None  # one failed request
    figures = summarize(requests, done)
    assert figures["failed"] == 1
    assert math.isclose(figures["short.ttft_mean"], 0.5) and math.isclose(figures["long.ttft_mean"], 2.0)
    assert math.isclose(figures["short.tpot_mean"], (1.7 - 0.5) / 3)
    assert math.isclose(figures["short.itl_max"], 1.0)  # the long prefill that stalled a decode


def test_records_set_each_disaggregated_figure_beside_the_colocated_one() -> None:
    requests = make_requests(QUICK, seed=0)
    answers: list[Completion | None] = [_done(1.0, [1.0, 1.5]) for _ in requests]
    colocated = Run({"short.ttft_mean": 2.0, "failed": 0.0}, answers)
    other = list(answers)
    other[0] = _done(1.0, [1.0])  # one answer differs
    disaggregated = Run({"short.ttft_mean": 1.0, "failed": 0.0, "decode_prompt_tokens": 1000.0,
                         "decode_loaded_tokens": 900.0, "prefill_fallbacks": 1.0, "handoff_waits": 2.0,
                         "handoff_wait_s": 0.25, "load_s": 1.0}, other)
    by_name = {r["metric"]: r for r in _records(requests, colocated, disaggregated, disaggregated)}
    assert by_name["pd.disaggregated.short.ttft_mean"]["ratio"] == 0.5
    assert by_name["pd.disaggregated_local_short.short.ttft_mean"]["ratio"] == 0.5
    assert by_name["pd.decode_computed_prompt_tokens"]["value"] == 100
    assert by_name["pd.identical_answers"]["value"] == len(requests) - 1
    assert by_name["pd.prefill_fallbacks"]["baseline_value"] == len(requests)
    assert by_name["pd.handoff_waits"]["value"] == 2 and by_name["pd.handoff_wait_seconds"]["ratio"] == 0.25
