"""Exact eviction orders of the tier policies, one narrative per policy (the replay-only ones: tests/sim)."""

from __future__ import annotations

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
