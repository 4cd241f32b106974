"""`kvstore bench serving`'s router: which replica each request goes to (round robin, least loaded, draining for
a rolling restart), and the proxy itself between real HTTP servers (tests/programs/openai_standin.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.serving_client import drive
from bench.serving_router import ReplicaSet, Router
from bench.serving_workload import Session
from kvstore.errors import ConfigError
from tests.helpers.pd_servers import Standin


def test_round_robin_alternates_whatever_is_in_flight() -> None:
    replicas = ReplicaSet(["a", "b"], policy="round_robin")
    assert [replicas.acquire() for _ in range(5)] == ["a", "b", "a", "b", "a"]
    assert replicas.num_served == {"a": 3, "b": 2} and replicas.in_flight("a") == 3


def test_least_loaded_picks_the_replica_with_fewest_in_flight() -> None:
    replicas = ReplicaSet(["a", "b", "c"], policy="least_loaded")
    first = [replicas.acquire() for _ in range(3)]
    assert sorted(first) == ["a", "b", "c"], "one each while all are equal"
    replicas.release("b")
    assert replicas.acquire() == "b", "b finished its request: it has the fewest"
    replicas.release("a")
    replicas.release("c")
    assert {replicas.acquire(), replicas.acquire()} == {"a", "c"}
    assert replicas.num_done == 3


def test_a_draining_replica_gets_nothing_new_and_is_replaced_once_idle() -> None:
    replicas = ReplicaSet(["a", "b"])
    assert replicas.acquire() == "a"
    replicas.drain("a")
    assert [replicas.acquire() for _ in range(3)] == ["b", "b", "b"]
    with pytest.raises(TimeoutError, match="still has 1 requests"):
        replicas.wait_drained("a", timeout_s=0.2)
    with pytest.raises(RuntimeError, match="drain it first"):
        replicas.replace("a", "a2")
    replicas.release("a")
    replicas.wait_drained("a", timeout_s=1.0)
    replicas.replace("a", "a2")
    assert replicas.urls == ["a2", "b"]
    assert "a2" in {replicas.acquire(), replicas.acquire()}, "the successor takes requests"


def test_bad_router_settings_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="use one of round_robin, least_loaded"):
        ReplicaSet(["a"], policy="random")
    with pytest.raises(ConfigError, match="distinct replica URLs"):
        ReplicaSet(["a", "a"])
    replicas = ReplicaSet(["a"])
    with pytest.raises(ConfigError, match="is not a replica"):
        replicas.drain("z")
    replicas.drain("a")
    with pytest.raises(RuntimeError, match="every replica is draining"):
        replicas.acquire()


@pytest.fixture
def two_standins(tmp_path: Path) -> Iterator[tuple[Standin, Standin]]:
    standins = (Standin("a", tmp_path, wait=False), Standin("b", tmp_path, wait=False))
    try:
        for standin in standins:
            standin.wait_up()
        yield standins
    finally:
        for standin in standins:
            standin.kill()


def test_the_turns_of_one_session_land_on_both_replicas(two_standins: tuple[Standin, Standin]) -> None:
    """What replicas_vllm measures: a router that knows nothing of KV sends a session's next turn to the other
    replica, whose prefix cache never saw its history."""
    a, b = two_standins
    session = Session(context=[5, 6, 7, 8], messages=[[10], [11], [12], [13]], arrivals_s=[0.0, 0.0, 0.0, 0.0])
    replicas = ReplicaSet([a.url, b.url])
    with Router(replicas).start() as router:
        result = drive(router.url, [session], answer_tokens=3)
    assert result.num_failed == 0 and len(result.completions) == 4
    assert all(c.ttft_s <= c.latency_s for c in result.completions), "answers streamed through the router"
    prompts = {name: [r["body"]["prompt"] for r in standin.received()] for name, standin in (("a", a), ("b", b))}
    assert [p[-1] for p in prompts["a"]] == [10, 12] and [p[-1] for p in prompts["b"]] == [11, 13]
    assert replicas.num_done == 4 and replicas.in_flight(a.url) == replicas.in_flight(b.url) == 0


def test_an_upstream_error_comes_back_as_a_failed_turn(two_standins: tuple[Standin, Standin]) -> None:
    a, b = two_standins
    b.control("set", fail=True)
    session = Session(context=[5, 6], messages=[[10], [11]], arrivals_s=[0.0, 0.0])
    replicas = ReplicaSet([a.url, b.url])
    with Router(replicas).start() as router:
        result = drive(router.url, [session], answer_tokens=2)
    assert (len(result.completions), result.num_failed) == (1, 1), "a's answer, then b's 500 ends the session"
    assert replicas.in_flight(b.url) == 0, "a failed request is released"
