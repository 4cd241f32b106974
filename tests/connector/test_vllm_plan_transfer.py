"""The vLLM connector's halves without vLLM: ChunkPlanner's decisions and PagedTransfer's bytes, over a real
TieredStore and real paged tensors in vLLM's CPU layout (what connector/vllm/vllm_connector.py wires up)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from connector.deadlines import Deadlines
from connector.embedded_store import EmbeddedStore
from connector.vllm.async_loads import AsyncLoads
from connector.vllm.handoff import Handoff
from connector.vllm.paged import PagedKind
from connector.vllm.plan import ChunkPlanner, ScheduledRequest, TransferSpec
from connector.vllm.transfer import PagedTransfer
from kvstore.config import StoreConfig
from kvstore.errors import ConfigError
from kvstore.hashing import ChunkHasher
from kvstore.layout import KVLayout
from kvstore.store import TieredStore

BLOCK, CHUNK, HEADS, DIM, LAYERS, NUM_BLOCKS = 4, 8, 2, 8, 2, 32
LAYOUT = KVLayout(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, dtype="float32", chunk_tokens=CHUNK)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TieredStore]:
    config = StoreConfig.embedded(layout=LAYOUT, root_dir=tmp_path, host_bytes=64 * LAYOUT.chunk_bytes,
                                  nvme_bytes=64 * (LAYOUT.chunk_bytes + 8192))
    with TieredStore(config) as s:
        yield s


def caches(seed: int | None = None) -> list[torch.Tensor]:
    out = [torch.zeros(NUM_BLOCKS, HEADS, BLOCK, 2 * DIM) for _ in range(LAYERS)]
    if seed is not None:
        gen = torch.Generator().manual_seed(seed)
        for cache in out:
            cache.normal_(generator=gen)
    return out


def hasher_of(store: TieredStore, chunk_tokens: int = CHUNK) -> Callable[[object], ChunkHasher]:
    def keys_of(prompt: object) -> ChunkHasher:
        hasher = ChunkHasher(store.root_key, chunk_tokens)
        hasher.extend(list(prompt))  # type: ignore[call-overload]
        return hasher

    return keys_of


def planner_for(store: TieredStore, chunk_tokens: int = CHUNK, block_size: int = BLOCK,
                save_decode: bool = True) -> ChunkPlanner:
    """The planner as the connector wires it: a request's key chain once, then a lookup of those keys."""
    return ChunkPlanner(hasher_of(store, chunk_tokens), store.lookup_keys, chunk_tokens=chunk_tokens,
                        block_size=block_size, save_decode=save_decode)


def matched(planner: ChunkPlanner, req_id: str, prompt: list[int], num_computed: int,
            handoff: Handoff | None = None) -> int:
    return planner.num_new_matched_tokens(req_id, prompt, len(prompt), num_computed, handoff)


def transfer_for(store: TieredStore, paged: list[torch.Tensor]) -> PagedTransfer:
    return PagedTransfer(EmbeddedStore(store, Deadlines(), "test"), paged, PagedKind.HEAD_PLANES, BLOCK)


PROMPT = list(range(100, 127))  # 27 tokens: 3 whole chunks of 8, and the last 3 tokens


def store_prompt(store: TieredStore, source: list[torch.Tensor], blocks: list[int]) -> None:
    """PROMPT computed into `blocks` of `source` and its whole chunks saved (as the connector's halves do)."""
    planner = planner_for(store)
    matched(planner, "a", PROMPT, 0)
    commit(store, source, planner.plan_step([ScheduledRequest("a", 0, len(PROMPT), blocks)]).saves)


def commit(store: TieredStore, source: list[torch.Tensor], saves: list[TransferSpec]) -> None:
    """Gather `saves` from `source` and wait until the store holds them."""
    saver = transfer_for(store, source)
    saver.save(saves)
    saver.wait()


def test_planner_saves_completed_chunks_once_and_loads_what_the_store_holds(store: Any) -> None:
    planner = planner_for(store)
    assert matched(planner, "a", PROMPT, 0) == 0
    blocks = list(range(7))
    first = planner.plan_step([ScheduledRequest("a", 0, 12, blocks)])  # chunked prefill: 12 tokens
    second = planner.plan_step([ScheduledRequest("a", 12, 15, blocks)])
    assert [(s.start_token, s.end_token) for s in first.saves] == [(0, 8)]
    assert [(s.start_token, s.end_token) for s in second.saves] == [(8, 24)]
    assert not planner.plan_step([ScheduledRequest("a", 27, 1, blocks)]).saves  # decode adds nothing
    transfer = transfer_for(store, caches(seed=1))
    transfer.save(first.saves + second.saves)
    transfer.wait()
    fresh = planner_for(store)
    assert matched(fresh, "b", PROMPT, 0) == 24
    assert matched(fresh, "c", PROMPT[:24], 0) == 23, "all whole chunks but the last token, which vLLM computes"
    assert matched(fresh, "d", PROMPT, 8) == 16, "only what vLLM does not hold yet"


def test_loaded_blocks_hold_the_saved_bytes(store: Any) -> None:
    source = caches(seed=2)
    src_blocks = [9, 3, 17, 5, 11, 1, 20]
    store_prompt(store, source, src_blocks)
    target = caches()
    loader_planner = planner_for(store)
    dst_blocks = [0, 2, 4, 6, 8, 10, 12]
    assert matched(loader_planner, "b", PROMPT, 4) == 20  # vLLM already holds block 0
    loader_planner.after_alloc("b", dst_blocks, 20)
    (spec,) = loader_planner.plan_step([]).loads
    assert transfer_for(store, target).load(spec) == set()
    for layer in range(LAYERS):
        for src, dst in zip(src_blocks[1:6], dst_blocks[1:6], strict=True):
            assert torch.equal(target[layer][dst], source[layer][src])
        assert bool((target[layer][dst_blocks[0]] == 0).all()), "blocks vLLM computed itself are not overwritten"


def test_a_load_from_disk_under_inference_mode_lands(store: Any) -> None:
    """Regression: vLLM calls start_load_kv under torch.inference_mode; the views the store made of
    the connector's buffers there could be written in place only inside that mode, and the store's
    disk readers (threads outside it) raised: every chunk held only on NVMe failed to load. The
    readers now run in the caller's inference mode (kvstore/store/reads.py)."""
    source = caches(seed=3)
    blocks = [9, 3, 17, 5, 11, 1, 20]
    store_prompt(store, source, blocks)
    store.flush()
    assert store.drop_tier_copies(store.levels[0].kind) > 0  # the chunks are now on NVMe only
    loader = planner_for(store)
    assert matched(loader, "b", PROMPT, 0) == 24
    loader.after_alloc("b", blocks, 24)
    (spec,) = loader.plan_step([]).loads
    target = caches()
    with torch.inference_mode():
        assert transfer_for(store, target).load(spec) == set()
    for layer in range(LAYERS):
        assert torch.equal(target[layer][blocks[:6]], source[layer][blocks[:6]])


def test_a_chunk_gone_before_the_load_is_reported_with_every_block_after_it(store: Any) -> None:
    store_prompt(store, caches(seed=3), list(range(7)))
    loader = planner_for(store)
    assert matched(loader, "b", PROMPT, 0) == 24
    store.remove(store.chunk_keys(PROMPT)[1])  # evicted between the scheduler's lookup and the worker's load
    dst = [20, 21, 22, 23, 24, 25, 26]
    loader.after_alloc("b", dst, 24)
    (spec,) = loader.plan_step([]).loads
    target = caches()
    transfer = transfer_for(store, target)
    assert transfer.load(spec) == {22, 23, 24, 25}  # the load covered blocks 20..25 (24 tokens)
    assert transfer.counters["loaded_chunks"] == 1 and transfer.counters["failed_chunks"] == 2
    assert bool((target[0][22:] == 0).all()), "nothing after the failed chunk is written"


def test_chunk_tokens_must_be_whole_blocks(store: Any) -> None:
    with pytest.raises(ConfigError, match="multiple of vLLM's block_size"):
        planner_for(store, chunk_tokens=12, block_size=8)


def test_the_answer_fills_chunks_that_are_saved_when_the_request_finishes(store: Any) -> None:
    """A conversation's next turn (prompt + answer + new message) then hits the answer's chunks too."""
    planner = planner_for(store)
    assert matched(planner, "a", PROMPT, 0) == 0
    blocks = list(range(10))
    first = planner.plan_step([ScheduledRequest("a", 0, 27, blocks)])
    answer = list(range(500, 515))  # 15 generated tokens: 42 in all, KV for the first 41
    assert planner.finished("a", PROMPT + answer, 41, blocks), "vLLM must keep the blocks for the save"
    finish = planner.plan_step([])
    assert finish.finished_saves == ["a"]
    assert [(s.start_token, s.end_token) for s in finish.saves] == [(24, 40)], "the two chunks the answer filled"
    transfer = transfer_for(store, caches(seed=5))
    transfer.save(first.saves + finish.saves)
    transfer.wait()
    next_turn = PROMPT + answer + [7, 8, 9]
    assert matched(planner_for(store), "b", next_turn, 0) == 40, "the whole history hits"
    assert not planner_for(store, save_decode=False).finished("x", PROMPT + answer, 41, blocks)


def test_a_finished_request_with_no_new_whole_chunk_frees_its_blocks_at_once(store: Any) -> None:
    planner = planner_for(store)
    matched(planner, "a", PROMPT, 0)
    planner.plan_step([ScheduledRequest("a", 0, 27, list(range(7)))])
    assert not planner.finished("a", PROMPT + [1, 2], 28, list(range(7)))  # 28 tokens: still 3 whole chunks
    assert not planner.finished("unknown", PROMPT, 27, [])
    assert planner.plan_step([]).finished_saves == []


def stored_for_loading(store: TieredStore, seed: int, blocks: list[int]) -> tuple[list[torch.Tensor], ChunkPlanner]:
    """PROMPT stored from `blocks` of caches of `seed`, and a fresh planner for the loading side."""
    source = caches(seed=seed)
    store_prompt(store, source, blocks)
    return source, planner_for(store)


def test_background_loads_report_their_request_and_failed_blocks_together(store: Any) -> None:
    blocks = [9, 3, 17, 5, 11, 1, 20]
    source, loader = stored_for_loading(store, 6, blocks)
    assert matched(loader, "b", PROMPT, 0) == 24
    loader.after_alloc("b", blocks, 24)
    (spec,) = loader.plan_step([]).loads
    store.remove(store.chunk_keys(PROMPT)[1])  # evicted after the lookup: chunks 1 and 2 must be recomputed
    target = caches()
    loads = AsyncLoads(transfer_for(store, target).load, BLOCK)
    loads.start(spec)
    deadline = time.monotonic() + 30
    done: set[str] = set()
    while not done:
        assert time.monotonic() < deadline, "the background load never finished"
        done, failed = loads.finished()
    assert done == {"b"} and failed == set(blocks[2:6]), "the failed blocks come with the request id"
    assert torch.equal(target[0][blocks[:2]], source[0][blocks[:2]])
    loads.close()


def test_a_step_that_schedules_no_token_is_planned_idle(store: Any) -> None:
    planner = planner_for(store)
    matched(planner, "a", PROMPT, 0)
    planner.after_alloc("a", list(range(7)), 0)
    assert planner.plan_step([]).idle, "nothing scheduled: the worker may wait for a load"
    assert planner.plan_step([ScheduledRequest("a", 0, 0, list(range(7)))]).idle
    assert not planner.plan_step([ScheduledRequest("a", 0, 4, list(range(7)))]).idle


def test_wait_any_returns_when_a_background_load_ends_and_not_before() -> None:
    gate = threading.Event()

    def load(spec: TransferSpec) -> set[int]:
        assert gate.wait(30), "the test never opened the gate"
        return set()

    loads = AsyncLoads(load, BLOCK)
    assert loads.wait_any(0.01), "no load running: nothing to wait for"
    loads.start(TransferSpec("r", (b"k" * 16,), 0, 0, CHUNK, (0, 1)))
    assert not loads.wait_any(0.05), "the load is held at the gate: the wait must time out"
    assert loads.finished() == (set(), set())
    gate.set()
    assert loads.wait_any(30), "the load ended: the wait must return"
    assert loads.finished() == ({"r"}, set())
    loads.close()


def test_wait_for_returns_when_the_named_loads_end_and_not_before() -> None:
    """The step's end waits for the loads it started (connector.vllm.finish_wait), not for older ones."""
    gates = {"new": threading.Event(), "old": threading.Event()}

    def load(spec: TransferSpec) -> set[int]:
        assert gates[spec.req_id].wait(30), "the test never opened the gate"
        return set()

    loads = AsyncLoads(load, BLOCK)
    assert loads.wait_for(["absent"], 0.01), "nothing named runs: nothing to wait for"
    for req_id in ("old", "new"):
        loads.start(TransferSpec(req_id, (b"k" * 16,), 0, 0, CHUNK, (0, 1)))
    assert not loads.wait_for(["new"], 0.05), "the load is held at its gate: the wait must time out"
    gates["new"].set()
    assert loads.wait_for(["new"], 30), "the named load ended: the wait must return while the other still runs"
    assert loads.finished() == ({"new"}, set())
    gates["old"].set()
    assert loads.wait_for(["old"], 30) and loads.finished() == ({"old"}, set())
    loads.close()


def test_a_load_told_to_run_in_the_step_is_planned_so(store: Any) -> None:
    blocks = [2, 4, 6, 8, 10, 12, 14]
    _, planner = stored_for_loading(store, 7, blocks)
    assert matched(planner, "bg", PROMPT, 0) == 24
    assert matched(planner, "now", PROMPT, 0) == 24
    planner.load_in_background("now", False)
    planner.after_alloc("bg", blocks, 24)
    planner.after_alloc("now", blocks, 24)
    specs = planner.plan_step([]).loads
    assert {spec.req_id: spec.background for spec in specs} == {"bg": True, "now": False}, \
        "each load runs where vLLM was told it runs"
    transfer = transfer_for(store, caches())
    assert all(transfer.load(spec) == set() for spec in specs)
    counted = transfer.take_counters()
    assert (counted["step_loads"], counted["background_loads"], counted["loaded_chunks"]) == (1, 1, 6)
