"""vLLM's kv_role in the connector's halves, and the prefill-to-decode handoff (connector.vllm.handoff), without
vLLM: real TieredStore, real paged tensors, a saver thread that commits late (the race the handoff closes)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from connector.deadlines import Deadlines
from connector.embedded_store import EmbeddedStore
from connector.vllm.handoff import PARAM, Handoff, handoff_wait_option, wait_until_held
from connector.vllm.plan import ChunkPlanner, ScheduledRequest, StepPlan
from kvstore.errors import ConfigError
from kvstore.store import TieredStore
from tests.connector.test_vllm_plan_transfer import (
    BLOCK,
    CHUNK,
    LAYERS,
    PROMPT,
    caches,
    commit,
    hasher_of,
    matched,
    store,
    transfer_for,
)

__all__ = ["store"]  # the fixture, shared with the plan/transfer tests


def planner(store: TieredStore, *, loads: bool = True, saves: bool = True, wait_s: float = 5.0,
            save_tail: bool = False) -> ChunkPlanner:
    return ChunkPlanner(hasher_of(store), store.lookup_keys, chunk_tokens=CHUNK, block_size=BLOCK,
                        loads=loads, saves=saves, handoff_wait_s=wait_s, save_tail=save_tail)


def prefill(store: TieredStore, prompt: list[int], blocks: list[int], seed: int,
            save_tail: bool = False) -> tuple[list[torch.Tensor], tuple[StepPlan, Handoff]]:
    """A producer computes `prompt` into `blocks` and saves; returns its caches and the save specs."""
    producer = planner(store, loads=False, save_tail=save_tail)
    assert matched(producer, "p", prompt, 0) == 0, "a producer never loads"
    plan = producer.plan_step([ScheduledRequest("p", 0, len(prompt), blocks)])
    handoff = producer.handoff("p")
    assert handoff is not None
    return caches(seed=seed), (plan, handoff)


def test_a_producer_saves_and_never_loads_a_consumer_loads_and_never_saves(store: TieredStore) -> None:
    blocks = list(range(7))
    source, (plan, handoff) = prefill(store, PROMPT, blocks, seed=11)
    assert [(s.start_token, s.end_token) for s in plan.saves] == [(0, 24)]
    assert handoff == Handoff(3, store.chunk_keys(PROMPT)[2])
    commit(store, source, plan.saves)
    producer = planner(store, loads=False)
    assert matched(producer, "again", PROMPT, 0) == 0, "held chunks are not loaded by a producer"
    assert not producer.plan_step([ScheduledRequest("again", 0, 27, blocks)]).saves, "nor saved twice"
    consumer = planner(store, saves=False)
    assert matched(consumer, "c", PROMPT, 0) == 24
    assert not consumer.plan_step([ScheduledRequest("c", 24, 3, blocks)]).saves
    assert not consumer.finished("c", PROMPT + list(range(40)), 66, blocks), "a consumer saves no answer either"
    assert consumer.handoff("c") is None


def test_handoff_params_round_trip_and_malformed_ones_are_ignored() -> None:
    handoff = Handoff(4, bytes(range(16)))
    assert Handoff.from_params(handoff.to_params()) == handoff
    tailed = Handoff(0, b"", 5, bytes(range(16, 32)))
    assert Handoff.from_params(tailed.to_params()) == tailed
    for bad in (None, {}, {PARAM: 3}, {PARAM: {"chunks": 0, "last_key": "00"}},
                {PARAM: {"chunks": 0, "last_key": ""}}, {PARAM: {"chunks": 1, "last_key": "00", "tail_tokens": 3}},
                {PARAM: {"chunks": True, "last_key": "00"}}, {PARAM: {"chunks": 2, "last_key": "zz"}},
                {PARAM: {"chunks": 2}}):
        assert Handoff.from_params(bad) is None, bad


def test_a_decode_instance_counts_announced_chunks_in_flight_and_its_load_waits_for_them(store: TieredStore) -> None:
    """The race: the decode request arrives before the prefill's saves reach the store."""
    blocks = [9, 3, 17, 5, 11, 1, 20]
    source, (plan, handoff) = prefill(store, PROMPT, blocks, seed=12)
    consumer = planner(store, saves=False)
    assert matched(consumer, "plain", PROMPT, 0) == 0, "without the handoff nothing is held yet"
    assert matched(consumer, "d", PROMPT, 0, handoff) == 24, "announced: counted at once"
    assert consumer.load_wait_s("d") == 5.0 and consumer.load_wait_s("plain") == 0.0
    dst = [0, 2, 4, 6, 8, 10, 12]
    consumer.after_alloc("d", dst, 24)
    (spec,) = consumer.plan_step([]).loads
    assert spec.wait_s == 5.0
    late = threading.Timer(0.3, lambda: (transfer_for(store, source).save(plan.saves)))
    late.start()
    target = caches()
    loader = transfer_for(store, target)
    assert loader.load(spec) == set(), "the load waited for the late chunks instead of failing them"
    late.join()
    assert loader.counters["handoff_waits"] == 1 and loader.counters["handoff_wait_seconds"] >= 0.2
    for layer in range(LAYERS):
        assert torch.equal(target[layer][dst[:6]], source[layer][blocks[:6]])


def test_chunks_that_never_arrive_are_recomputed_after_the_bounded_wait(store: TieredStore) -> None:
    blocks = list(range(7))
    _, (_, handoff) = prefill(store, PROMPT, blocks, seed=13)  # its saves are lost
    consumer = planner(store, saves=False, wait_s=0.2)
    assert matched(consumer, "d", PROMPT, 0, handoff) == 24
    consumer.after_alloc("d", blocks, 24)
    (spec,) = consumer.plan_step([]).loads
    loader = transfer_for(store, caches())
    assert loader.load(spec) == set(blocks[:6]), "every announced block is recomputed"
    assert 0.2 <= loader.counters["handoff_wait_seconds"] < 5


def test_a_handoff_about_another_prompt_or_model_is_ignored(store: TieredStore) -> None:
    _, (_, handoff) = prefill(store, PROMPT, list(range(7)), seed=14)
    consumer = planner(store, saves=False)
    other = [t + 1 for t in PROMPT]
    assert matched(consumer, "other", other, 0, handoff) == 0
    shorter = PROMPT[:12]  # one whole chunk: the announcement names a third one it does not have
    assert matched(consumer, "short", shorter, 0, handoff) == 0


def test_a_prompt_of_whole_chunks_loads_all_but_its_last_token(store: TieredStore) -> None:
    prompt = PROMPT[:24]
    blocks = [4, 5, 6, 7, 8, 9]
    source, (plan, _) = prefill(store, prompt, blocks, seed=15)
    commit(store, source, plan.saves)
    consumer = planner(store, saves=False)
    assert matched(consumer, "d", prompt, 0) == 23
    consumer.after_alloc("d", blocks, 23)
    (spec,) = consumer.plan_step([]).loads
    target = caches()
    assert transfer_for(store, target).load(spec) == set()
    assert torch.equal(target[0][blocks], source[0][blocks])


def test_wait_until_held_returns_at_once_when_held_and_polls_a_real_store(store: TieredStore) -> None:
    guarded = EmbeddedStore(store, Deadlines(), "test")
    keys = store.chunk_keys(PROMPT)
    start = time.monotonic()
    down = lambda: guarded.breaker.is_open  # noqa: E731
    assert wait_until_held(guarded.lookup_keys, [], 5, store_down=down) < 0.05
    waited = wait_until_held(guarded.lookup_keys, keys[:1], 0.1, store_down=down)
    assert waited >= 0.1 and time.monotonic() - start < 5


@pytest.mark.parametrize("value", ["x", -1, 601, None])
def test_a_bad_handoff_wait_is_refused_naming_the_option(value: object) -> None:
    with pytest.raises(ConfigError, match="handoff_wait_s"):
        handoff_wait_option({"handoff_wait_s": value})
    assert handoff_wait_option({}) == 5.0 and handoff_wait_option({"handoff_wait_s": "0.5"}) == 0.5


def test_a_handed_over_partial_last_chunk_leaves_only_the_last_token_to_compute(store: TieredStore) -> None:
    """save_tail: the producer saves the prompt's 3-token tail under its own key; the consumer loads it."""
    blocks = [9, 3, 17, 5, 11, 1, 20]
    source, (plan, handoff) = prefill(store, PROMPT, blocks, seed=16, save_tail=True)
    assert [(s.start_token, s.end_token, s.first_chunk) for s in plan.saves] == [(0, 24, 0), (24, 27, 3)]
    assert handoff.chunks == 3 and handoff.tail_tokens == 3 and handoff.tail_key not in store.chunk_keys(PROMPT)
    commit(store, source, plan.saves)
    consumer = planner(store, saves=False)
    assert matched(consumer, "plain", PROMPT, 0) == 24, "without the handoff the tail is not known"
    assert matched(consumer, "d", PROMPT, 0, handoff) == 26, "all but the last token"
    dst = [0, 2, 4, 6, 8, 10, 12]
    consumer.after_alloc("d", dst, 26)
    (spec,) = consumer.plan_step([]).loads
    assert spec.keys[-1] == handoff.tail_key and len(spec.block_ids) == 7
    target = caches()
    assert transfer_for(store, target).load(spec) == set()
    for layer in range(LAYERS):
        assert torch.equal(target[layer][dst], source[layer][blocks]), "the tail's block landed too"
    other = PROMPT[:26] + [999]  # same whole chunks, another tail: its tail key differs
    assert matched(planner(store, saves=False), "o", other, 0, handoff) == 24


def test_a_prompt_under_one_chunk_hands_over_its_tail_alone(store: TieredStore) -> None:
    prompt = PROMPT[:6]
    source, (plan, handoff) = prefill(store, prompt, [7, 8], seed=17, save_tail=True)
    assert handoff.chunks == 0 and handoff.tail_tokens == 6
    assert Handoff.from_params(handoff.to_params()) == handoff
    commit(store, source, plan.saves)
    consumer = planner(store, saves=False)
    assert matched(consumer, "d", prompt, 0, handoff) == 5
    consumer.after_alloc("d", [1, 2], 5)
    (spec,) = consumer.plan_step([]).loads
    target = caches()
    assert transfer_for(store, target).load(spec) == set()
    assert torch.equal(target[0][[1, 2]], source[0][[7, 8]])
