"""Replay on a slice of the real Mooncake trace (the one kvstore ships: its first 2,000 requests),
checked against a brute-force re-count."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest

from kvstore.bundled import BUNDLED_TRACES
from kvstore.errors import ConfigError, UnknownPolicyError
from kvstore.sim.replay import access_sequence, replay, replay_many
from kvstore.sim.trace import Trace, TraceRequest, load_mooncake

TRACE = BUNDLED_TRACES["mooncake-sample"]
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason=f"{TRACE} not present")


def brute_force_lru(trace: Trace, capacity: int) -> tuple[int, int, int, int, int]:
    """Independent LRU cache (OrderedDict), same touch order: hits, prefix hits, prefix tokens."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = prefix = prefix_tokens = accesses = tokens = 0
    for req in trace.requests:
        flags = [b in cache for b in req.block_ids]
        run = 0
        while run < len(flags) and flags[run]:
            run += 1
        hits, prefix, accesses = hits + sum(flags), prefix + run, accesses + len(flags)
        tokens += req.input_tokens
        prefix_tokens += min(req.input_tokens, run * 512)
        for block in reversed(req.block_ids):
            cache[block] = None
            cache.move_to_end(block)
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits, prefix, prefix_tokens, accesses, tokens


@needs_trace
@pytest.mark.parametrize("pct", [1.0, 10.0])
def test_lru_replay_matches_a_brute_force_recount(pct: float) -> None:
    trace = load_mooncake(TRACE, limit=300)
    result = replay(trace, "lru", pct)
    hits, prefix, prefix_tokens, accesses, tokens = brute_force_lru(trace, result.capacity_blocks)
    assert result.num_accesses == accesses
    assert result.capacity_blocks == round(trace.num_distinct_blocks * pct / 100)
    assert result.block_hit_rate == hits / accesses
    assert result.prefix_hit_rate == prefix / accesses
    assert result.token_hit_rate == prefix_tokens / tokens


@needs_trace
def test_min_bounds_every_policy_and_infinite_cache_hits_every_reuse() -> None:
    trace = load_mooncake(TRACE, limit=300)
    results = replay_many(trace, ["lru", "arc", "lfu", "s3fifo", "pace", "lru+ghost", "min"], [2.0], processes=1,
                          progress=False)
    bound = results[-1].block_hit_rate
    assert all(r.block_hit_rate <= bound + 1e-12 for r in results)
    every_reuse = 1 - trace.num_distinct_blocks / trace.num_accesses
    assert replay(trace, "lru", 100.0).block_hit_rate == pytest.approx(every_reuse)
    assert replay(trace, "min", 100.0).block_hit_rate == pytest.approx(every_reuse)


def test_hand_counted_tiny_trace() -> None:
    """Three requests, 2-block cache, LRU, touched tail first:
    r1 [1,2,3] 3 misses -> cache keeps 2,1 (1 most recent); r2 [1,2,4]: hits 1,2 (prefix 2), miss 4;
    cache after r2 (tail first 4,2,1): {2,1}; r3 [1,5]: hit 1, miss 5 (partial: 700 tokens)."""
    trace = Trace("tiny", [TraceRequest(0, 1536, (1, 2, 3)), TraceRequest(1, 1536, (1, 2, 4)),
                           TraceRequest(2, 700, (1, 5))])
    result = replay(trace, "lru", 2 / 5 * 100)
    assert result.capacity_blocks == 2
    assert result.block_hit_rate == 3 / 8 and result.prefix_hit_rate == 3 / 8
    assert result.token_hit_rate == (2 * 512 + 512) / (1536 + 1536 + 700)
    assert access_sequence(trace) == [3, 2, 1, 4, 2, 1, 5, 1]


def test_bad_inputs_name_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        load_mooncake(bad)
    trace = Trace("t", [TraceRequest(0, 512, (1,))])
    with pytest.raises(ConfigError, match="percentage"):
        replay(trace, "lru", 0)
    with pytest.raises(UnknownPolicyError, match="valid"):
        replay_many(trace, ["belady"], [5.0], progress=False)


@needs_trace
def test_cli_writes_json_records_and_a_plot(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvstore.cli import app

    out, png = tmp_path / "r.json", tmp_path / "r.png"
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--policy", "lru", "min", "--capacity", "1", "5",
                                      "--limit", "200", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    assert [(r["policy"], r["capacity_pct"]) for r in records] == [("lru", 1.0), ("lru", 5.0), ("min", 1.0), ("min", 5.0)]
    assert set(records[0]) == {"trace", "policy", "capacity_pct", "block_hit_rate", "prefix_hit_rate", "token_hit_rate",
                               "blocks_per_s"}
    assert all(r["blocks_per_s"] > 0 for r in records)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "x MIN" in result.output


@pytest.mark.parametrize("name", ["mooncake-sample", "azure-sample"])
def test_cli_replays_a_bundled_trace_by_name(name: str) -> None:
    """Both shipped traces replay from any folder; the Azure CSV gets block ids from the stated reuse model."""
    from typer.testing import CliRunner

    from kvstore.cli import app

    result = CliRunner().invoke(app, ["replay", name, "--policy", "lru", "min", "--capacity", "10", "--limit", "300",
                                      "--sessions", "20"])
    assert result.exit_code == 0, result.output
    assert ("conversations" in result.output) is (name == "azure-sample")  # the reuse model is stated
    rows = [line for line in result.output.splitlines() if "10%" in line]
    lru, best = (float(row.split("│")[4].strip(" %")) for row in rows)
    assert 0 < lru <= best  # reuse found, and MIN bounds LRU


def test_cli_names_a_missing_trace_and_the_bundled_ones(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvstore.cli import app

    # Rich boxes the error at the terminal's width: 80 columns without one (an xdist worker) would cut the names
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "nope.jsonl")], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output  # a usage error, not a traceback
    assert "Traceback" not in result.output
    assert "mooncake-sample" in result.output and "nope.jsonl" in result.output
