"""Scheduler scenarios with exact expectations, driven without a model (a fake step appends token 7)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from connector.engine.block_pool import BlockPool
from connector.engine.llm_engine import LLMEngine
from connector.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from connector.engine.sequence import SamplingParams, Sequence, SequenceStatus
from connector.kv_connector import KVConnector
from kvstore.errors import ConfigError
from tests.connector.conftest import CHUNK, MODEL, PAGE, engine_config, prompt


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(num_blocks: int = 64, **options: object) -> tuple[Scheduler, Clock]:
    clock = Clock()
    return Scheduler(SchedulerConfig(**options), BlockPool(num_blocks, PAGE), clock=clock), clock  # type: ignore[arg-type]


def seq(name: str, num_tokens: int, max_tokens: int = 4, arrival: float = 0.0, first: int | None = None) -> Sequence:
    first = sum(map(ord, name)) * 1000 if first is None else first  # distinct prompts unless asked
    return Sequence(list(range(first, first + num_tokens)), SamplingParams(max_tokens=max_tokens),
                    arrival_time=arrival, request_id=name, page_size=PAGE)


def apply(sched: Scheduler, out: SchedulerOutput, now: float = 0.0) -> dict[str, int]:
    """What a model step would do: advance, sample token 7 at the end of a prefill/decode, finish."""
    for s, n in out.num_scheduled_tokens.items():
        s.num_computed_tokens += n
        sched.commit(s)
        if s.num_computed_tokens == s.num_tokens:
            s.append_token(7, now)
            if s.is_finished_by_params:
                sched.finish(s)
    return {s.request_id: n for s, n in out.num_scheduled_tokens.items()}


def test_chunked_prefill_respects_token_budget_and_max_num_seqs() -> None:
    sched, _ = make(max_num_batched_tokens=16, max_num_seqs=2)
    for name in "ABC":
        sched.add(seq(name, 30))
    steps = [apply(sched, sched.schedule()) for _ in range(5)]
    assert steps == [
        {"A": 16},            # A's first chunk uses the whole budget
        {"A": 14, "B": 2},    # A finishes its prompt; B is admitted into the remaining 2 tokens
        {"A": 1, "B": 15},    # decode first, then B's prefill; C waits: max_num_seqs = 2
        {"A": 1, "B": 13},
        {"A": 1, "B": 1},     # both decode; still only 2 sequences
    ]
    assert all(sum(s.values()) <= 16 and len(s) <= 2 for s in steps)


def test_a_shared_prefix_reuses_computed_pages() -> None:
    sched, _ = make(max_num_batched_tokens=16, max_num_seqs=2)
    a, b = seq("A", 30, first=1), seq("B", 30, first=1)
    sched.add(a)
    sched.add(b)
    assert [apply(sched, sched.schedule()) for _ in range(3)] == [{"A": 16}, {"A": 14, "B": 2}, {"A": 1, "B": 12}]
    # B found A's first 4 pages (16 tokens, computed in step 1) in the pool and shares them
    assert b.num_pool_hit_tokens == 16 and b.block_ids[:4] == a.block_ids[:4]
    assert [sched.pool.ref_counts[i] for i in a.block_ids[:4]] == [2, 2, 2, 2]


def test_decode_is_never_starved_by_a_long_prefill() -> None:
    sched, _ = make(max_num_batched_tokens=16, max_num_seqs=4)
    sched.add(seq("A", 5, max_tokens=20))
    apply(sched, sched.schedule())
    sched.add(seq("long", 200))
    for _ in range(10):
        assert apply(sched, sched.schedule()) == {"A": 1, "long": 15}


def test_admission_blocks_when_pages_do_not_fit_and_resumes_after_free() -> None:
    sched, _ = make(num_blocks=10, max_num_batched_tokens=64, max_num_seqs=8)
    a, b, c = seq("A", 30, max_tokens=2), seq("B", 12), seq("C", 3)
    for s in (a, b, c):
        sched.add(s)
    assert apply(sched, sched.schedule()) == {"A": 30}  # A takes 8 of 10 pages; B needs 3: blocked
    assert sched.pool.num_free_blocks == 2 and b.status is SequenceStatus.WAITING
    assert c.status is SequenceStatus.WAITING  # FCFS: C does not jump the blocked head of the queue
    assert apply(sched, sched.schedule()) == {"A": 1}  # A's 2nd token finishes it, freeing its pages
    assert apply(sched, sched.schedule()) == {"B": 12, "C": 3}


def test_a_request_blocked_on_pages_asks_the_store_once_until_this_engine_stores_more(store: Any) -> None:
    """Regression: a request blocked on pages comes back to admission every step, and each visit hashed
    its prompt and asked the store (a sidecar round trip) on the path to every first token."""
    connector = KVConnector(store, PAGE)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8), BlockPool(10, PAGE), connector)
    a, b = seq("A", 30, max_tokens=4), seq("B", 12)
    sched.add(a)
    sched.add(b)

    def lookups() -> int:
        return int(store.stats()["lookups"])

    apply(sched, sched.schedule())  # A takes 8 of 10 pages; B needs 3: blocked
    asked = lookups()
    for _ in range(2):
        apply(sched, sched.schedule())
        assert b.status is SequenceStatus.WAITING
    assert lookups() == asked  # B was not asked again while nothing changed
    kv = torch.zeros(MODEL.num_layers, 2, CHUNK // PAGE, PAGE, MODEL.num_kv_heads, MODEL.head_dim,
                     dtype=store.layout.torch_dtype)  # the engine's cache: [layers, K/V, blocks, page, heads, dim]
    connector.save(list(range(CHUNK)), list(range(CHUNK // PAGE)), kv)
    connector.wait_for_save()
    apply(sched, sched.schedule())  # this engine stored a chunk: B's hit may have grown, so it is asked again
    assert lookups() == asked + 1


def test_preemption_frees_the_latest_sequence_and_it_resumes_first() -> None:
    sched, _ = make(num_blocks=6, max_num_batched_tokens=64, max_num_seqs=4)
    a, b = seq("A", 8, max_tokens=10), seq("B", 8, max_tokens=10)
    sched.add(a)
    sched.add(b)
    apply(sched, sched.schedule())  # 4 pages used, 2 free
    for _ in range(4):  # A and B fill their 2 spare pages one token at a time...
        apply(sched, sched.schedule())
    out = sched.schedule()  # ...then A needs a 4th page: B (admitted last) is preempted by recompute
    assert out.preempted == [b] and set(out.num_scheduled_tokens) == {a}
    assert b.num_computed_tokens == 0 and sched.waiting[0] is b and sched.num_preemptions == 1


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_requests_produce_the_same_tokens(mode: str, store: Any) -> None:
    prompts = [prompt(50 + i, 20 + 3 * i) for i in range(4)]
    sampling = SamplingParams(max_tokens=24)
    want = LLMEngine(engine_config()).generate(prompts, sampling)
    config = engine_config(preemption_mode=mode)
    tight = LLMEngine.with_store(config.__class__(**{**_fields(config), "num_blocks": 24}), store)  # type: ignore[arg-type]
    assert tight.generate(prompts, sampling) == want
    assert tight.scheduler.num_preemptions >= 1
    if mode == "swap":
        assert sum(s.num_store_hit_tokens for s in tight.finished) > 0  # resumed from swapped-out chunks


def _fields(config: object) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}  # type: ignore[attr-defined]


def test_static_batching_admits_only_after_the_whole_batch_finishes() -> None:
    sched, _ = make(max_num_batched_tokens=64, max_num_seqs=2, mode="static")
    for name, max_tokens in (("A", 1), ("B", 3), ("C", 1)):
        sched.add(seq(name, 4, max_tokens=max_tokens))
    assert apply(sched, sched.schedule()) == {"A": 4, "B": 4}
    assert apply(sched, sched.schedule()) == {"B": 1}  # A finished, but C waits for B
    assert apply(sched, sched.schedule()) == {"B": 1}
    assert apply(sched, sched.schedule()) == {"C": 4}


def test_dynamic_batching_waits_for_a_full_batch_or_the_timeout() -> None:
    sched, clock = make(max_num_batched_tokens=64, max_num_seqs=3, mode="dynamic", max_batch_wait_s=1.0)
    sched.add(seq("A", 4))
    assert apply(sched, sched.schedule(), clock.t) == {}  # 1 of 3 and only 0 s waited
    clock.t = 1.0
    assert apply(sched, sched.schedule(), clock.t) == {"A": 4}


def test_config_rejects_budget_below_max_num_seqs() -> None:
    with pytest.raises(ConfigError, match="max_num_seqs"):
        SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=8)
    with pytest.raises(ConfigError, match="valid"):
        SchedulerConfig(mode="bogus")


def _admission_order(policy: str, options: dict, shorts: int = 12) -> list[str]:
    """One request runs at a time; a long one waits while a short one arrives every step."""
    sched, clock = make(num_blocks=512, max_num_batched_tokens=512, max_num_seqs=1, policy=policy,
                        policy_options=tuple(options.items()))
    sched.add(seq("long", 400, max_tokens=1, arrival=0.0))
    order = []  # type: ignore[var-annotated]
    for step in range(shorts + 2):
        clock.t = float(step)
        if step < shorts:
            sched.add(seq(f"s{step}", 8, max_tokens=1, arrival=clock.t))
        order.extend(apply(sched, sched.schedule(), clock.t))
    return order


def test_aging_policies_bound_a_long_requests_wait() -> None:
    assert _admission_order("fcfs", {})[0] == "long"
    assert _admission_order("spf", {"aging_tokens_per_s": 0.0}).index("long") == 12  # starved while shorts come
    # aging 100 tok/s: long (400) outranks a fresh short (8) once it has waited > 3.92 s
    assert _admission_order("spf", {"aging_tokens_per_s": 100.0}).index("long") == 4
    assert _admission_order("quota", {"max_passes": 3}).index("long") == 3  # passed exactly 3 times
    assert _admission_order("quota", {"max_passes": 99, "max_debt_tokens": 40}).index("long") == 5  # 5 x 8 tokens
