"""Exact eviction orders, one narrative per policy, plus MIN against brute force."""

from __future__ import annotations

import functools
import random

import pytest

from policies.eviction import AccessInfo, make_eviction_policy
from tests.policies.conftest import INFO, drive


def chain_infos(length: int, root: str) -> list[AccessInfo]:
    return [AccessInfo(position=i, chain_chunks=length, root=root) for i in range(length)]


def test_lru_evicts_a_chain_tail_before_its_head() -> None:
    """The cache touches a request tail first, so the head is most recent and outlives the tail."""
    lru = make_eviction_policy("lru")
    for i in (2, 1, 0):  # request [h0, h1, h2] touched tail first
        lru.on_insert(f"h{i}", chain_infos(3, "h0")[i])
    assert lru.victims(3) == ["h2", "h1", "h0"]
    lru.on_access("h2", INFO)
    assert lru.victims(1) == ["h1"]


def test_lfu_ages_out_blocks_that_were_popular_long_ago() -> None:
    lfu = make_eviction_policy("lfu")
    lfu.on_insert("a", INFO)
    for _ in range(3):
        lfu.on_access("a", INFO)  # a: 4 uses
    lfu.on_insert("b", INFO)  # b: 1 use
    assert lfu.victims(1) == ["b"]
    lfu.on_remove("b")  # the cache's age becomes b's value (1)
    lfu.on_insert("c", INFO)  # c starts at age 1 + 1 use = 2
    assert lfu.victims(2) == ["c", "a"]
    for _ in range(3):
        lfu.on_access("c", INFO)  # c: 1 + 4 = 5 > a's 4, with the same count as a
    assert lfu.victims(2) == ["a", "c"]


def test_lfu_breaks_ties_tail_first() -> None:
    lfu = make_eviction_policy("lfu")
    for i in (0, 1, 2):  # inserted head first on purpose: position decides, not age
        lfu.on_insert(f"k{i}", AccessInfo(position=i, chain_chunks=3))
    assert lfu.victims(3) == ["k2", "k1", "k0"]


def test_arc_ghost_hits_move_the_target() -> None:
    """A B1 ghost hit grows p (recency was short of room), a B2 ghost hit shrinks it."""
    arc = make_eviction_policy("arc", capacity=2)
    arc.on_insert("a", INFO)
    arc.on_access("a", INFO)  # T2 = [a]
    arc.on_insert("b", INFO)  # T1 = [b]
    arc.on_insert("c", INFO)  # T1 = [b, c], one too many
    assert (arc.p, arc.victims(1)) == (0.0, ["b"])  # type: ignore[attr-defined]  # |T1| > p: T1's LRU goes
    arc.on_remove("b")
    assert list(arc.b1) == ["b"]  # type: ignore[attr-defined]
    arc.on_insert("b", INFO)  # ghost hit in B1: p += max(|B2|/|B1|, 1) = 1; b -> T2
    assert arc.p == 1.0 and list(arc.t2) == ["a", "b"]  # type: ignore[attr-defined]
    assert arc.victims(1) == ["a"]  # |T1| = 1 is not > p: T2's LRU goes
    arc.on_remove("a")
    assert list(arc.b2) == ["a"]  # type: ignore[attr-defined]
    arc.on_insert("a", INFO)  # ghost hit in B2: p -= max(|B1|/|B2|, 1) = 1
    assert arc.p == 0.0  # type: ignore[attr-defined]
    assert arc.victims(1) == ["c"]


def test_s3fifo_filters_one_hit_wonders() -> None:
    """Keys used once pass through the small FIFO and leave in order; a key hit while in S is
    promoted to M and survives; an evicted key that comes back goes straight to M (ghost)."""
    s3 = make_eviction_policy("s3fifo", capacity=4)  # S target 0.4: S evicts whenever it holds a key
    stream = ["h", "h", "x1", "x2", "x3", "x4", "x5", "x6"]
    hits, evicted, resident = drive(s3, stream, 4)
    assert hits == 1
    assert evicted == ["x1", "x2", "x3"]
    assert list(s3.main) == ["h"] and list(s3.small) == ["x4", "x5", "x6"]  # type: ignore[attr-defined]
    assert list(s3.ghost) == ["x1", "x2", "x3"]  # type: ignore[attr-defined]
    s3.on_insert("x1", INFO)  # back from the ghost: into M, not S
    assert list(s3.main) == ["h", "x1"]  # type: ignore[attr-defined]
    assert s3.victims(1) == ["x4"]


def test_s3fifo_main_gives_a_second_chance_while_freq_lasts() -> None:
    s3 = make_eviction_policy("s3fifo", capacity=2, small_ratio=0.0)  # everything from S goes via M rules
    for key in ("a", "b"):
        s3.on_insert(key, INFO)
        s3.on_access(key, INFO)
    s3.on_insert("c", INFO)
    # S = [a, b, c]; a and b were hit in S so they move to M; c was not: c is the victim
    assert s3.victims(1) == ["c"]


@functools.cache
def _best(stream: tuple[int, ...], capacity: int, index: int, resident: frozenset[int]) -> int:
    """Most hits achievable from `index` on, trying every bypass/eviction choice."""
    if index == len(stream):
        return 0
    key = stream[index]
    if key in resident:
        return 1 + _best(stream, capacity, index + 1, resident)
    options = [_best(stream, capacity, index + 1, resident)]  # bypass
    if len(resident) < capacity:
        options.append(_best(stream, capacity, index + 1, resident | {key}))
    else:
        options += [_best(stream, capacity, index + 1, (resident - {v}) | {key}) for v in resident]
    return max(options)


@pytest.mark.parametrize("seed", range(30))
def test_min_is_optimal_on_small_random_streams(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.randint(1, 3)
    stream = [rng.randrange(5) for _ in range(rng.randint(6, 14))]
    policy = make_eviction_policy("min", future=stream)
    hits, _, _ = drive(policy, stream, capacity)
    assert hits == _best(tuple(stream), capacity, 0, frozenset())


def test_min_prepare_replaces_the_future_and_bypasses_useless_inserts() -> None:
    policy = make_eviction_policy("min")
    policy.prepare(["a", "b", "c", "a", "b"])  # type: ignore[attr-defined]
    hits, evicted, _ = drive(policy, ["a", "b", "c", "a", "b"], 2)
    assert hits == 2 and evicted == ["c"]  # c is never used again: it is the one dropped


def test_pace_evicts_tail_first_and_learns_to_skip_partial_blocks() -> None:
    pace = make_eviction_policy("pace", capacity=3)
    for i in (2, 1, 0):
        info = chain_infos(3, "r0")[i]
        pace.on_miss(f"r0/{i}", info)  # type: ignore[attr-defined]
        pace.on_insert(f"r0/{i}", info)
    assert pace.victims(3) == ["r0/2", "r0/1", "r0/0"]



def _full_and_partial_stream(turns: int) -> list[tuple[str, AccessInfo]]:
    """Per turn: one of 4 full blocks (they come back every 4 turns) and a new partial last block."""
    stream = []
    for turn in range(turns):
        stream.append((f"full{turn % 4}", AccessInfo(position=0, chain_chunks=2)))
        stream.append((f"part{turn}", AccessInfo(position=1, chain_chunks=2, is_partial=True)))
    return stream


@pytest.mark.parametrize("name", ["lru", "pace"])
def test_pace_learns_that_partial_blocks_never_return(name: str) -> None:
    """6 slots, reuse distance 8 distinct blocks: LRU misses every full block; PACE learns the
    partial class never comes back, stops letting it push full blocks out, and hits them."""
    policy = make_eviction_policy(name, capacity=6) if name == "pace" else make_eviction_policy(name)
    resident: set[str] = set()
    late_full_hits = 0
    for step, (key, info) in enumerate(_full_and_partial_stream(300)):
        if key in resident:
            late_full_hits += step >= 400
            policy.on_access(key, info)
            continue
        if name == "pace":
            policy.on_miss(key, info)  # type: ignore[attr-defined]
            if not policy.admit(key, info):  # type: ignore[attr-defined]
                continue
        policy.on_insert(key, info)
        resident.add(key)
        while len(resident) > 6:
            victim = policy.victims(1)[0]
            resident.discard(victim)
            policy.on_remove(victim)
    assert late_full_hits == (0 if name == "lru" else 100)
