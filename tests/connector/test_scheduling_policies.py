"""Scheduling policies: registry, FCFS order, SPF aging arithmetic, quota pass/debt accounting."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from connector.engine.scheduling.base import SchedulingPolicy
from connector.engine.scheduling.registry import make_scheduling_policy, scheduling_policy_names
from kvstore.errors import ConfigError, UnknownPolicyError


@dataclass
class Req:
    request_id: str
    arrival_time: float
    num_prompt_tokens: int


def test_registry_lists_and_builds_every_policy() -> None:
    assert scheduling_policy_names() == ["fcfs", "quota", "spf"]
    for name in scheduling_policy_names():
        assert isinstance(make_scheduling_policy(name), SchedulingPolicy)
    with pytest.raises(UnknownPolicyError, match="valid: fcfs, quota, spf"):
        make_scheduling_policy("lifo")
    with pytest.raises(ConfigError):
        make_scheduling_policy("spf", aging_tokens_per_s=-1)


def test_fcfs_orders_by_arrival() -> None:
    reqs = [Req("b", 2.0, 5), Req("a", 1.0, 500), Req("c", 3.0, 1)]
    assert [r.request_id for r in make_scheduling_policy("fcfs").order(reqs, 10.0)] == ["a", "b", "c"]


def test_spf_aging_lets_a_long_prompt_overtake_after_its_credit() -> None:
    spf = make_scheduling_policy("spf", aging_tokens_per_s=10.0)
    long = Req("long", 0.0, 100)
    # a short arriving at 5 s ranks 20 against the long one's 100 - 10 * 5 = 50: short first
    assert [r.request_id for r in spf.order([long, Req("s", 5.0, 20)], 5.0)] == ["s", "long"]
    # one arriving at 9 s ranks 20 against 100 - 10 * 9 = 10: the long one has earned its turn
    assert [r.request_id for r in spf.order([long, Req("s", 9.0, 20)], 9.0)] == ["long", "s"]


def test_quota_counts_passes_and_debt_and_then_puts_the_victim_first() -> None:
    quota = make_scheduling_policy("quota", max_passes=2, max_debt_tokens=1000)
    long = Req("long", 0.0, 900)
    for i in range(2):
        short = Req(f"s{i}", 1.0 + i, 10)
        assert quota.order([long, short], 1.0 + i)[0] is short
        quota.on_admit(short, [long], 1.0 + i)
    assert quota.passes["long"] == 2 and quota.debt_tokens["long"] == 20
    assert quota.order([long, Req("s9", 9.0, 1)], 9.0)[0] is long
    quota.on_admit(long, [], 9.0)
    assert "long" not in quota.passes  # forgotten once admitted
