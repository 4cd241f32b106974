"""Routers on hand-made nodes, and the routing simulation on the Mooncake trace (and through the CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvstore.cluster.index import NodeInfo
from kvstore.cluster.routing import CacheAwareRouter, make_router
from kvstore.errors import ConfigError, UnknownNameError
from kvstore.sim.route_sim import ROUTINGS, simulate
from kvstore.sim.trace import load_mooncake

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation.jsonl"
HELD = {"a": [b"k0", b"k1"], "b": [b"k0", b"k1", b"k2"], "c": []}


def _prefix(keys: Any, node_ids: Any) -> Any:
    return {n: next((i for i, k in enumerate(keys) if k not in HELD[n]), len(keys)) for n in node_ids}


def test_cache_aware_takes_the_longest_prefix_then_the_lowest_load() -> None:
    router = CacheAwareRouter(_prefix)
    nodes = [NodeInfo("a", 0.0), NodeInfo("b", 9.0), NodeInfo("c", 0.0)]
    decision = router.choose([b"k0", b"k1", b"k2"], nodes)
    assert (decision.node_id, decision.cached_chunks) == ("b", 3)  # longest prefix wins even when busy
    assert router.choose([b"k0", b"k1"], nodes).node_id == "a"  # a and b tie at 2: a is less loaded
    assert router.choose([b"zz"], nodes).node_id == "a"  # nobody: least loaded, then by name


def test_balanced_cache_aware_skips_overloaded_nodes() -> None:
    router = make_router("cache-aware-balanced", _prefix, max_load_gap=2.0)
    nodes = [NodeInfo("a", 1.0), NodeInfo("b", 9.0), NodeInfo("c", 0.0)]
    assert router.choose([b"k0", b"k1", b"k2"], nodes).node_id == "a"  # b is 9 behind c: best among a and c


def test_round_robin_and_first_block_hash() -> None:
    nodes = [NodeInfo(n) for n in "abc"]
    rr = make_router("round-robin")
    assert [rr.choose([b"k"], nodes).node_id for _ in range(4)] == ["a", "b", "c", "a"]
    fbh = make_router("first-block-hash")
    chosen = {fbh.choose([b"same", bytes([i])], nodes).node_id for i in range(20)}
    assert len(chosen) == 1  # same first block, same node
    spread = {fbh.choose([bytes([i])], nodes).node_id for i in range(64)}
    assert spread == {"a", "b", "c"}


def test_unknown_router_and_missing_prefix_are_named() -> None:
    with pytest.raises(UnknownNameError, match="round-robin"):
        make_router("random")
    with pytest.raises(ConfigError, match="prefix function"):
        make_router("cache-aware")
    with pytest.raises(ConfigError, match="no node"):
        make_router("round-robin").choose([b"k"], [])
    with pytest.raises(ConfigError, match="takes no max_load_gap"):
        make_router("first-block-hash", max_load_gap=1.0)


@pytest.fixture(scope="module")
def trace() -> Any:
    if not TRACE.exists():
        pytest.skip(f"trace {TRACE} not present")
    return load_mooncake(TRACE, limit=3000)


def test_balanced_cache_aware_beats_round_robin_on_the_mooncake_trace(trace: Any) -> None:
    results = {r: simulate(trace, num_nodes=4, routing=r, capacity_pct=5.0) for r in ROUTINGS}
    balanced, rr = results["cache-aware-balanced"], results["round-robin"]
    assert balanced.token_hit_rate > rr.token_hit_rate and balanced.imbalance < 1.5
    # every request shares block 0 (a system prompt): pure longest-prefix and first-block hashing
    # both send all traffic to one node
    assert results["cache-aware"].imbalance == results["first-block-hash"].imbalance == 4.0


def test_replay_cli_prints_the_routing_table(trace: Any) -> None:
    from kvstore.cli import app

    result = CliRunner().invoke(app, ["replay", str(TRACE), "--nodes", "4", "--nodes", "8", "--routing", "round-robin",
                                      "--routing", "cache-aware-balanced", "--limit", "500"])
    assert result.exit_code == 0, result.output
    assert "round-robin" in result.output and "cache-aware-balanced" in result.output
    assert result.output.count("5% (") == 4  # 2 node counts x 2 routers, default capacity 5% per node
