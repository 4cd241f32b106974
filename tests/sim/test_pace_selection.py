"""PACE's two guards: right-censored age statistics, and following LRU when a shadow LRU wins."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import pytest

import kvstore.sim.eviction._lru_guard as guard_module
from kvstore.sim.eviction import make_replay_policy
from kvstore.sim.eviction._age_stats import NUM_BUCKETS, PRIOR_WEIGHT, bucket, bucket_floor, row_scores
from policies.eviction import AccessInfo, make_eviction_policy

FULL = AccessInfo(position=0, chain_chunks=2)
PARTIAL = AccessInfo(position=1, chain_chunks=2, is_partial=True)
CAPACITY = 40


def _pace(capacity: int) -> Any:
    return make_replay_policy("pace", capacity=capacity).eviction


def _row(**counts: float) -> list[float]:
    row = [0.0] * NUM_BUCKETS
    for name, value in counts.items():
        row[int(name[1:])] = value
    return row


def test_open_episodes_are_charged_the_time_they_have_waited() -> None:
    """One block reused at age 2; T = 4, so the window of bucket 0 reaches bucket(4) = 8 (ages 4-5).
    Alone: 1 reuse over a wait of 3. An open block of age 4 (bucket 8, inside the window) adds its
    wait so far, 4 - 0 + 1 = 5; one far past the window (bucket 20) adds all of T = 4."""
    horizon = 4
    ends = [bucket(bucket_floor(b) + horizon) for b in range(NUM_BUCKETS)]
    assert ends[0] == 8 and bucket_floor(8) == 4 and bucket_floor(20) > bucket_floor(0) + horizon
    reuse, end = _row(b2=1.0), _row()
    prior_weight = PRIOR_WEIGHT * horizon
    assert row_scores(reuse, end, ends, None, horizon)[0] == 1 / (3 + prior_weight)
    assert row_scores(reuse, end, ends, None, horizon, _row())[0] == 1 / (3 + prior_weight)
    assert row_scores(reuse, end, ends, None, horizon, _row(b8=1.0))[0] == 1 / (3 + 5 + prior_weight)
    assert row_scores(reuse, end, ends, None, horizon, _row(b20=1.0))[0] == 1 / (3 + 4 + prior_weight)
    # an open block younger than the bucket has not reached it: it changes nothing there
    assert row_scores(reuse, end, ends, None, horizon, _row(b1=1.0))[2] == row_scores(reuse, end, ends, None,
                                                                                    horizon)[2]


def test_open_episodes_count_resident_and_remembered_blocks_by_class_and_age() -> None:
    pace = _pace(2)
    for key in ("a", "b", "c"):  # c pushes a (the oldest) into the ghost
        pace.on_miss(key, FULL)  # type: ignore[attr-defined]
        pace.on_insert(key, FULL)
        if len(pace) > 2:
            pace.on_remove(pace.victims(1)[0])
    alive = pace._open_episodes()  # type: ignore[attr-defined]
    counts = {(cls, b): v for cls, row in enumerate(alive) for b, v in enumerate(row) if v}
    # turn 1 (each block is its own request), never touched again: class 1; ages 2 (a), 1 (b), 0 (c)
    assert counts == {(1, 2): 1.0, (1, 1): 1.0, (1, 0): 1.0}
    assert list(pace._ghost) == ["a"]  # type: ignore[attr-defined]


def test_touch_memory_keeps_the_touch_count_of_keys_the_ghost_forgot_but_not_as_a_reuse() -> None:
    pace = _pace(2)

    def touch(key: str) -> None:
        pace.on_miss(key, FULL)  # type: ignore[attr-defined]
        pace.on_insert(key, FULL)
        if len(pace) > 2:
            pace.on_remove(pace.victims(1)[0])

    for key in ["a"] + [f"k{i}" for i in range(20)]:  # a leaves the cache, then the ghost (16 keys)
        touch(key)
    assert "a" not in pace._ghost and "a" in pace._memory  # type: ignore[attr-defined]
    ends, reuses = sum(map(sum, pace._end)), sum(map(sum, pace._reuse))  # type: ignore[arg-type, attr-defined]
    assert ends > 0  # the ghost closed a's episode (and others') as ends
    touch("a")
    assert sum(map(sum, pace._reuse)) == reuses  # type: ignore[arg-type, attr-defined]  # not a reuse for the statistics ...
    assert pace._where["a"].state & 0xFFFF == 1  # type: ignore[attr-defined]  # ... but a comes back as a block touched once before
    assert "a" not in pace._memory  # type: ignore[attr-defined]


def _phase_one(turns: int, recurring: int) -> list[tuple[str, AccessInfo]]:
    """Scan resistance matters: `recurring` full blocks come back every `recurring` turns, each
    turn also brings a partial block that is never seen again. LRU (40 slots, 2 x 28 distinct
    blocks between reuses) misses everything; keeping the full blocks hits them all."""
    stream = []
    for turn in range(turns):
        stream.append((f"full{turn % recurring}", FULL))
        stream.append((f"part{turn}", PARTIAL))
    return stream


def _phase_two(turns: int, batch: int) -> list[tuple[str, AccessInfo]]:
    """The workload shifts: full blocks are all new, partial blocks come back once, `batch` turns
    later (2 x 16 blocks apart: inside LRU's 40 slots), and the learned classes are now wrong."""
    stream = []
    for turn in range(turns):
        stream.append((f"new{turn}", FULL))
        stream.append((f"rep{(turn // (2 * batch)) * batch + turn % batch}", PARTIAL))
    return stream


def _run(policy: Any, stream: Sequence[tuple[str, AccessInfo]]) -> tuple[list[int], list[str]]:
    """Drive a CAPACITY-block cache with admission; per access: hit (0/1) and the policy's mode.
    While PACE follows LRU it must admit everything and evict exactly the least recently used."""
    resident: OrderedDict[str, None] = OrderedDict()
    hits: list[int] = []
    modes: list[str] = []
    for key, info in stream:
        if key in resident:
            resident.move_to_end(key)
            hits.append(1)
            policy.on_access(key, info)
        else:
            hits.append(0)
            policy.on_miss(key, info)
            following_lru = getattr(policy, "mode", "lru") == "lru"
            if policy.admit(key, info):
                policy.on_insert(key, info)
                resident[key] = None
                while len(resident) > CAPACITY:
                    victim = policy.victims(1)[0]
                    if following_lru:
                        assert victim == next(iter(resident)), "following LRU evicts the oldest block"
                    del resident[victim]
                    policy.on_remove(victim)
            else:
                assert not following_lru, "following LRU admits every block"
        modes.append(getattr(policy, "mode", "lru"))
    return hits, modes


class _LRUWithAdmission:
    """LRU with the admission hooks the driver calls (it admits everything)."""

    def __init__(self) -> None:
        self._lru = make_eviction_policy("lru")

    def on_miss(self, key: str, info: AccessInfo) -> None:
        pass

    def admit(self, key: str, info: AccessInfo) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lru, name)


PHASE_ONE, PHASE_TWO = _phase_one(3000, 28), _phase_two(3000, 16)


def test_where_scan_resistance_matters_pace_never_follows_lru() -> None:
    lru_hits, _ = _run(_LRUWithAdmission(), PHASE_ONE)
    pace_hits, modes = _run(_pace(CAPACITY), PHASE_ONE)
    full_reuses = sum(1 for key, info in PHASE_ONE if not info.is_partial) - 28  # all but each block's first use
    assert sum(lru_hits) == 0
    assert sum(pace_hits) >= 0.98 * full_reuses  # keeps (nearly) every full block once warmed up
    assert set(modes) == {"pace"}


def test_when_lru_wins_clearly_pace_follows_it_then_tries_itself_again(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = PHASE_ONE + PHASE_TWO
    lru_hits, _ = _run(_LRUWithAdmission(), stream)
    pace_hits, modes = _run(_pace(CAPACITY), stream)
    monkeypatch.setattr(guard_module, "LRU_LEAD_Z", float("inf"))  # the same PACE without the guard
    alone_hits, alone_modes = _run(_pace(CAPACITY), stream)
    shift = len(PHASE_ONE)
    lru, alone, guarded = sum(lru_hits[shift:]), sum(alone_hits[shift:]), sum(pace_hits[shift:])
    assert set(alone_modes) == {"pace"}
    assert lru > guarded > alone  # PACE alone keeps the dead full blocks until it relearns ...
    assert guarded - alone >= 0.1 * (lru - alone)  # ... following LRU while it leads recovers part of it
    first_lru = modes.index("lru")
    assert shift < first_lru < shift + len(PHASE_TWO) // 4  # the guard fires after the shift, and soon
    assert "lru" not in modes[:shift] and modes[-1] == "pace"  # and PACE tries itself again afterwards
    assert 0 < modes.count("lru") < len(PHASE_TWO) // 2
