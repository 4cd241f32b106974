"""Hypothesis: on random workloads and pool sizes the scheduler keeps its invariants at every step."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from connector.engine.block_pool import BlockPool
from connector.engine.scheduler import Scheduler, SchedulerConfig
from connector.engine.sequence import SamplingParams, Sequence, SequenceStatus

PAGE = 4

requests = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 3)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(requests, st.integers(12, 40), st.sampled_from(["continuous", "static"]),
       st.sampled_from(["fcfs", "spf", "quota"]), st.integers(4, 32))
def test_invariants_hold_and_everything_finishes(reqs: Any, num_blocks: Any, mode: Any, policy: Any, budget: Any) -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, mode=mode, policy=policy),
                      BlockPool(num_blocks, PAGE), clock=lambda: 0.0)
    seqs = []
    for i, (length, max_tokens, family) in enumerate(reqs):
        length = min(length, (num_blocks - 1) * PAGE - max_tokens)  # every request fits an empty pool
        tokens = [family * 1000 + t for t in range(max(1, length))]  # same family: shared prefixes
        seqs.append(Sequence(tokens, SamplingParams(max_tokens=max_tokens), request_id=f"r{i:02d}", page_size=PAGE))
        sched.add(seqs[-1])
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        decoding = [s for s in sched.running if s.is_decoding]
        out = sched.schedule()
        assert out.total_tokens <= budget and len(sched.running) <= 4
        for s in decoding:  # decode never starved: scheduled unless preempted this very step
            assert s in out.num_scheduled_tokens or s in out.preempted
        for s, n in out.num_scheduled_tokens.items():
            assert 1 <= n <= s.num_remaining_tokens and s.status is SequenceStatus.RUNNING
            assert len(s.block_ids) * PAGE >= s.num_computed_tokens + n  # pages exist for every fed token
        refs = Counter(b for s in sched.running for b in s.block_ids)
        assert all(sched.pool.ref_counts[b] == refs.get(b, 0) for b in range(num_blocks))
        assert sched.pool.num_free_blocks == sum(1 for b in range(num_blocks) if refs.get(b, 0) == 0)
        for s, n in out.num_scheduled_tokens.items():
            s.num_computed_tokens += n
            sched.commit(s)
            if s.num_computed_tokens == s.num_tokens:
                s.append_token(1, 0.0)
                if s.is_finished_by_params:
                    sched.finish(s)
    assert all(s.status is SequenceStatus.FINISHED and len(s.output_token_ids) == s.sampling.max_tokens for s in seqs)
